// A release, end to end, against registries this test starts (issue 44):
//   registry.ts     an OCI registry on 127.0.0.1 (crane registry serve)
//   scripts/release.sh --registry 127.0.0.1:PORT --sign-key <a key made here> --npm-registry <verdaccio>
//                   the image for linux/amd64 and linux/arm64 as one index, SBOMs attested,
//                   signatures, the chart as an OCI artifact, the npm package
//   platforms.ts    each platform's content: the node binary's architecture, the user, the
//                   entrypoint; the arm64 bundle run under qemu-user and answering
//   signatures.ts   cosign verify: the release key passes, another key and an unsigned digest
//                   fail; the SBOMs read back and compared with the bundle's packages
//   npm-registry.ts the npm package from a registry on loopback: `npx cos-auth-proxy demo`
//                   from an empty directory and an empty cache, 200 through it
//   kubelet.ts      the chart installed from oci:// on a real node, whose containerd pulls
//                   the image by digest from the registry: Ready, 200 through it
// and nothing left behind.
//
// A tap file, not part of `npm test` (that runs test/**/*.test.ts; the release's fast checks,
// test/release/*.test.ts, are there). Run as root, after `npm ci` (CI runs it after the
// packaging and kubelet steps, whose image stand-ins and node binaries it reuses):
//   npm run test:release
// Without root or podman it is one skipped test that says what is missing (CI counts a skip as
// a failure).
// env: COS_RELEASE_TIMEOUT_S (default 2400), COS_KUBE_VERSION (the node's, default v1.37.2).
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { equal, ok, section, suite } from '../harness/checks.js'
import { ROOT, seconds, sh } from '../harness/processes.js'
import { podFromRegistry, stopPodFromRegistry } from './kubelet.js'
import { npmFromRegistry } from './npm-registry.js'
import { platformContent } from './platforms.js'
import { startRegistry, type Registry } from './registry.js'
import { sbomAttested, signatures, type Released } from './signatures.js'

const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version
const PASSWORD = 'release-test-only'

const tool = (name: string): string => {
  const r = sh('bash', [join(ROOT, 'scripts/tools/get-go-tool.sh'), name], { timeoutMs: 1_800_000 })
  if (r.code !== 0) throw new Error(`${name}: ${r.stderr.trim().split('\n').slice(-3).join(' / ')}`)
  return r.stdout.trim()
}

/** Runs a command, its output shown indented as it comes; resolves with its stdout. */
async function streamed (cmd: string, args: readonly string[], env: NodeJS.ProcessEnv): Promise<{ code: number, stdout: string }> {
  const child = spawn(cmd, args, { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  createInterface({ input: child.stdout }).on('line', line => { stdout += `${line}\n`; console.log(`    > ${line}`) })
  createInterface({ input: child.stderr }).on('line', line => { console.log(`    | ${line}`) })
  const code = await new Promise<number>(resolve => child.on('close', c => { resolve(c ?? 1) }))
  return { code, stdout }
}

// The project's images in podman's store (the stand-in bases are a cache, kept on purpose).
const images = (): string[] => sh('podman', ['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', 'reference=localhost/cos-auth-proxy'])
  .stdout.trim().split('\n').filter(l => l !== '').sort()
let work = ''
let registry: Registry | undefined
let stopped = false
/** Everything down (once): the pod and node, the registry, the release's images, the work directory. */
function stopAll (): void {
  if (stopped) return
  stopped = true
  stopPodFromRegistry()
  registry?.stop()
  sh('podman', ['manifest', 'rm', `localhost/cos-auth-proxy:release-${VERSION}`])
  for (const arch of ['amd64', 'arm64']) sh('podman', ['rmi', '--force', `localhost/cos-auth-proxy:release-${VERSION}-${arch}`])
  if (work !== '') rmSync(work, { recursive: true, force: true })
}

suite('release', {
  prerequisites: [
    () => process.getuid?.() !== 0 ? { why: 'not root', how: 'run as root (rootful podman, the node\'s network namespace)' } : undefined,
    () => sh('podman', ['--version']).code !== 0 ? { why: 'no podman', how: 'apt-get install podman (the images are built with it)' } : undefined,
  ],
  timeoutS: Number(process.env.COS_RELEASE_TIMEOUT_S ?? '2400'),
  stop: stopAll,
  setUp: () => {
    work = mkdtempSync(join(tmpdir(), 'cos-release-'))
    return Promise.resolve({ imagesBefore: images(), t0: Date.now() })
  },
}, async ({ imagesBefore, t0 }) => {
  let crane = ''
  let cosign = ''
  await section('tools', async () => {
    const t = Date.now()
    crane = tool('crane')
    cosign = tool('cosign')
    ok(crane !== '' && cosign !== '', `crane and cosign, built from their Go modules or cached (${seconds(t)})`)
    if (sh('qemu-aarch64-static', ['--version']).code !== 0) {
      sh('apt-get', ['install', '-y', '-qq', '--no-install-recommends', 'qemu-user-static'], { env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, timeoutMs: 600_000 })
    }
    ok(sh('qemu-aarch64-static', ['--version']).code === 0, 'qemu-aarch64-static (Debian\'s qemu-user-static; nothing registered with binfmt_misc)')
  })

  const keys = { release: join(work, 'release'), other: join(work, 'other') }
  await section('registry and keys', async () => {
    registry = await startRegistry(crane)
    ok(true, `crane registry serve on ${registry.host}, its blobs in a temporary directory`)
    for (const dir of Object.values(keys)) {
      const g = sh('bash', ['-c', `mkdir -p "$1" && cd "$1" && "$0" generate-key-pair`, cosign, dir], { env: { ...process.env, COSIGN_PASSWORD: PASSWORD } })
      ok(g.code === 0, `cosign generate-key-pair in ${dir.replace(work, '<tmp>')}`, g.stderr)
    }
  })
  if (registry === undefined) return
  const reg = registry.host

  const out = join(work, 'out')
  const lines: Record<string, string[]> = {}
  await section('scripts/release.sh', async () => {
    const t = Date.now()
    const r = await streamed('bash', ['scripts/release.sh', '--registry', reg, '--version', VERSION, '--sign-key', join(keys.release, 'cosign.key'), '--out', out],
      { ...process.env, COSIGN_PASSWORD: PASSWORD })
    for (const line of r.stdout.trim().split('\n')) {
      const [kind, ...rest] = line.split(' ')
      if (kind !== undefined && rest.length > 0) (lines[kind] ??= []).push(rest.join(' '))
    }
    ok(r.code === 0, `scripts/release.sh --registry ${reg} --version ${VERSION} --sign-key <key>: exit ${r.code} (${seconds(t)})`)
    ok(lines.image?.[0]?.startsWith(`${reg}/cos-auth-proxy@sha256:`) === true, `image ${lines.image?.[0] ?? '(none)'}`)
    ok(lines.chart?.[0]?.startsWith(`${reg}/charts/cos-auth-proxy@sha256:`) === true, `chart ${lines.chart?.[0] ?? '(none)'}`)
    ok(lines.sbom?.length === 2, `sbom: ${lines.sbom?.length ?? 0} lines (one per platform)`)
    ok(lines.npm?.[0]?.startsWith(`cos-auth-proxy@${VERSION}`) === true, `npm ${lines.npm?.[0] ?? '(none)'}`)
  })
  const image = lines.image?.[0]
  const chart = lines.chart?.[0]
  if (image === undefined || chart === undefined) return

  let nodeVersions: Record<string, string> = {}
  await section('each platform\'s content', async () => {
    nodeVersions = await platformContent({ crane, ref: image, insecure: true })
  })

  const platforms = (lines.sbom ?? []).map(l => {
    const [sbom = '', ref = ''] = l.split(' ')
    return { platform: `linux/${/sbom-linux-(\w+)\.cdx\.json$/.exec(sbom)?.[1] ?? '?'}`, ref, sbom }
  })
  const released: Released = { cosign, crane, publicKey: join(keys.release, 'cosign.pub'), otherKey: join(keys.other, 'cosign.pub'), image, chart, platforms, root: ROOT }
  await section('signatures', async () => { signatures(released) })
  await section('SBOMs', async () => {
    sbomAttested(released, nodeVersions)
  })

  await section('the npm package, from a registry on loopback', async () => {
    const tgz = /\(packed: (\S+\.tgz);/.exec(lines.npm?.[0] ?? '')?.[1] ?? ''
    ok(tgz !== '', `the packed npm package in the release's output (${tgz.replace(out, '<out>')})`)
    if (tgz !== '') await npmFromRegistry({ tgz, version: VERSION })
  })

  await section('the chart from oci:// on a real node, the image pulled by digest', async () => {
    await podFromRegistry({
      registry: reg,
      chart: `oci://${reg}/charts/cos-auth-proxy`,
      chartVersion: VERSION,
      image: `${reg}/cos-auth-proxy`,
      digest: image.replace(/^.*@/, ''),
    })
  })

  await section('nothing left', async () => {
    stopAll()
    const pid = registry?.pid ?? 0
    await Promise.race([registry?.exited, new Promise(resolve => setTimeout(resolve, 5000))])
    const left = sh('ps', ['-o', 'pid=,args=', '-p', String(pid)]).stdout.trim()
    ok(pid > 0 && left === '', `the registry's process (${pid}) is gone`, left)
    equal(images(), imagesBefore, `podman's store holds the project's images it held before (${imagesBefore.join(', ') || 'none'}): the per-platform images and the list removed`)
  })
  console.log(`release: ${seconds(t0)} in all`)
})
