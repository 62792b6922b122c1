// Each platform's content, not only the index's list of platforms (a list that
// says arm64 over an x86-64 binary passes every check that reads only the list:
// oauth2-proxy#1442, and buildah 1.28's one-command multi-platform build here).
// For the index REG/cos-auth-proxy@sha256:… a release pushed:
//   - exactly two entries, linux/amd64 and linux/arm64, each an image manifest;
//   - per entry, its config: architecture and os those of the entry, user 65532:65532,
//     the entrypoint `/nodejs/bin/node --max-semi-space-size=8 /app/dist/cos-auth-proxy.mjs`;
//   - per entry, its filesystem (crane export): /nodejs/bin/node's ELF header (64-bit,
//     e_machine 62 x86-64 or 183 aarch64) is the entry's architecture, the bundle is the
//     same bytes in both (bundled once), the compile cache holds nothing of another
//     architecture (the arm64 image carries none: see the Dockerfile);
//   - the arm64 entry runs: its own node, under qemu-aarch64-static -L <its root> (user-mode
//     emulation of one process; nothing registered with binfmt_misc), answers --version
//     with the release's version, then serves: a request through it to a mock COS API on
//     loopback (the bundle's own mock-api, run by this machine's node) gets 200.
// The amd64 entry's node answers --version too, through its own loader.
// Temporary directories and processes are removed in a finally.
//
// Alone, against an index already pushed (plain HTTP to a loopback registry):
//   node --import tsx test/e2e/release/platforms.ts 127.0.0.1:PORT/cos-auth-proxy@sha256:…
import { spawn, type ChildProcess } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtempSync, openSync, readFileSync, readSync, closeSync, readdirSync, rmSync, writeFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { pathToFileURL } from 'node:url'
import { equal, ok } from '../harness/checks.js'
import { freePort, ROOT, sh } from '../harness/processes.js'
import { scaled } from '../../support/time-scale.js'

const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version
const ENTRYPOINT = ['/nodejs/bin/node', '--max-semi-space-size=8', '/app/dist/cos-auth-proxy.mjs']
const BUNDLE = 'app/dist/cos-auth-proxy.mjs'
/** ELF e_machine and Node's process.arch (the compile cache's directory names) per OCI architecture. */
const ARCH: Record<string, { machine: number, name: string, node: string }> = {
  amd64: { machine: 62, name: 'x86-64', node: 'x64' },
  arm64: { machine: 183, name: 'aarch64', node: 'arm64' },
}

const IMAGE_MANIFESTS = ['application/vnd.oci.image.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v2+json']

interface Entry { mediaType?: string, digest: string, platform?: { os?: string, architecture?: string, variant?: string } }
interface ImageConfig { architecture?: string, os?: string, variant?: string, config?: { User?: string, Entrypoint?: string[], Env?: string[], Labels?: Record<string, string> } }

export interface PlatformOptions {
  crane: string
  /** REG/cos-auth-proxy@sha256:<index digest> */
  ref: string
  /** plain HTTP (a loopback registry) */
  insecure: boolean
}

/** Checks each entry; resolves with the Node version each platform's image carries (its node, run), for the SBOM check. */
export async function platformContent (opts: PlatformOptions): Promise<Record<string, string>> {
  const flags = opts.insecure ? ['--insecure'] : []
  const repo = opts.ref.replace(/@sha256:[0-9a-f]{64}$/, '').replace(/:[^/:]+$/, '')
  const crane = (...args: string[]): string => {
    const r = sh(opts.crane, [...args.slice(0, 1), ...flags, ...args.slice(1)], { timeoutMs: 300_000 })
    if (r.code !== 0) throw new Error(`crane ${args.join(' ')}: ${r.stderr.trim().split('\n').slice(-2).join(' / ')}`)
    return r.stdout
  }
  const index = JSON.parse(crane('manifest', opts.ref)) as { mediaType?: string, manifests?: Entry[] }
  const entries = index.manifests ?? []
  const platforms = entries.map(e => `${e.platform?.os ?? '?'}/${e.platform?.architecture ?? '?'}`).sort()
  equal(platforms, ['linux/amd64', 'linux/arm64'], `the index lists exactly linux/amd64 and linux/arm64 (${platforms.join(', ')})`)

  const work = mkdtempSync(join(tmpdir(), 'cos-platforms-'))
  const bundles = new Map<string, string>()
  const nodeVersions: Record<string, string> = {}
  try {
    for (const entry of entries) {
      const os = entry.platform?.os ?? '?'
      const arch = entry.platform?.architecture ?? '?'
      const platform = `${os}/${arch}`
      const ref = `${repo}@${entry.digest}`
      const want = ARCH[arch]
      ok(want !== undefined && os === 'linux', `${platform}: an architecture this release builds`)
      ok(entry.mediaType === undefined || IMAGE_MANIFESTS.includes(entry.mediaType), `${platform}: the entry is an image manifest (${entry.mediaType ?? 'no mediaType'})`)
      if (arch === 'arm64') ok(entry.platform?.variant === undefined || entry.platform.variant === 'v8', `${platform}: variant ${entry.platform?.variant ?? '(none)'}`)

      const config = JSON.parse(crane('config', ref)) as ImageConfig
      equal(`${config.os ?? '?'}/${config.architecture ?? '?'}`, platform, `${platform}: its config says ${config.os ?? '?'}/${config.architecture ?? '?'}`)
      equal(config.config?.User, '65532:65532', `${platform}: user ${config.config?.User ?? '(none)'}`)
      equal(config.config?.Entrypoint, ENTRYPOINT, `${platform}: entrypoint ${(config.config?.Entrypoint ?? []).join(' ')}`)
      equal(config.config?.Labels?.['org.opencontainers.image.version'], VERSION, `${platform}: label org.opencontainers.image.version ${VERSION}`)

      const root = mkdtempSync(join(work, `root-${arch}-`))
      const x = sh('bash', ['-c', '"$0" export "${@:3}" "$1" - | tar -xf - -C "$2"', opts.crane, ref, root, ...flags], { timeoutMs: 600_000 })
      if (!ok(x.code === 0, `${platform}: crane export ${short(ref)} | tar -x`, x.stderr.trim())) continue
      const elf = elfOf(join(root, 'nodejs/bin/node'))
      ok(elf !== undefined && elf.class64 && elf.littleEndian && elf.machine === want?.machine,
        `${platform}: /nodejs/bin/node is a 64-bit ${want?.name ?? '?'} ELF binary (e_machine ${elf?.machine ?? 'none'}, ${elf?.class64 === true ? '64' : '32'}-bit)`)
      if (existsSync(join(root, BUNDLE))) bundles.set(platform, createHash('sha256').update(readFileSync(join(root, BUNDLE))).digest('hex'))
      ok(bundles.has(platform), `${platform}: /${BUNDLE} is there`)
      const caches = existsSync(join(root, 'app/compile-cache')) ? readdirSync(join(root, 'app/compile-cache')) : undefined
      ok(caches !== undefined && caches.every(d => d.includes(`-${want?.node ?? '?'}-`)) && (arch !== 'amd64' || caches.length > 0),
        `${platform}: /app/compile-cache holds ${caches === undefined ? 'nothing (missing)' : caches.length === 0 ? 'no entry (starts cold)' : caches.join(', ')}`)

      const env = imageEnv(config, root)
      // Its node, run on this machine: through the image's own loader, or under qemu-user.
      const node = arch === 'amd64'
        ? [join(root, 'lib64/ld-linux-x86-64.so.2'), '--library-path', `${root}/lib/x86_64-linux-gnu:${root}/usr/lib/x86_64-linux-gnu`, join(root, 'nodejs/bin/node')]
        : [qemu(), '-L', root, join(root, 'nodejs/bin/node')]
      nodeVersions[platform] = sh(node[0] ?? '', [...node.slice(1), '--version'], { env, timeoutMs: scaled(120_000) }).stdout.trim().replace(/^v/, '')
      if (arch === 'amd64') {
        const v = sh(node[0] ?? '', [...node.slice(1), ...ENTRYPOINT.slice(1, -1), join(root, BUNDLE), '--version'], { env, timeoutMs: scaled(60_000) })
        equal(v.stdout.trim(), `cos-auth-proxy ${VERSION}`, `${platform}: its node, through its own loader, runs the bundle: --version says ${v.stdout.trim() || v.stderr.trim().slice(0, 200)}`)
      }
      if (arch === 'arm64') await arm64Runs(root, env, work)
      rmSync(root, { recursive: true, force: true })
    }
    ok(bundles.size === 2 && new Set(bundles.values()).size === 1, `the bundle is the same bytes on both platforms (bundled once: ${[...new Set(bundles.values())].map(h => h.slice(0, 12)).join(', ')})`)
    return nodeVersions
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
}

const short = (ref: string): string => ref.replace(/@sha256:([0-9a-f]{12})[0-9a-f]+$/, '@sha256:$1…')

function elfOf (file: string): { class64: boolean, littleEndian: boolean, machine: number } | undefined {
  if (!existsSync(file)) return undefined
  const b = Buffer.alloc(20)
  const fd = openSync(file, 'r')
  try { readSync(fd, b, 0, 20, 0) } finally { closeSync(fd) }
  if (b.readUInt32BE(0) !== 0x7f454c46) return undefined
  const littleEndian = b[5] === 1
  return { class64: b[4] === 2, littleEndian, machine: littleEndian ? b.readUInt16LE(18) : b.readUInt16BE(18) }
}

/** The image's environment for a run outside it: its Env, the compile cache where it was exported, no PATH of the host's. */
function imageEnv (config: ImageConfig, root: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const kv of config.config?.Env ?? []) env[kv.slice(0, kv.indexOf('='))] = kv.slice(kv.indexOf('=') + 1)
  // A path inside the image; outside it, the exported copy (a cache written there goes with it)
  if (env.NODE_COMPILE_CACHE !== undefined) env.NODE_COMPILE_CACHE = join(root, env.NODE_COMPILE_CACHE)
  env.COS_ADMIN_HOST = '127.0.0.1' // the image's 0.0.0.0 is for the kubelet; here, loopback only
  return env
}

/** The absolute path of qemu-aarch64-static (the processes it runs get the image's environment, without PATH). */
function qemu (): string {
  const which = (): string => sh('bash', ['-c', 'command -v qemu-aarch64-static || true']).stdout.trim()
  if (which() === '') {
    sh('apt-get', ['install', '-y', '-qq', '--no-install-recommends', 'qemu-user-static'], { env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, timeoutMs: 600_000 })
  }
  const path = which()
  const v = path === '' ? undefined : sh(path, ['--version'])
  ok(v?.code === 0, `${path || 'qemu-aarch64-static'}: ${v?.stdout.split('\n')[0] ?? 'missing'} (Debian's qemu-user-static; nothing registered with binfmt_misc)`, v?.stderr)
  return path || 'qemu-aarch64-static'
}

/** The arm64 bundle, on the arm64 node, under qemu-user: --version, then serve and one request through it. */
async function arm64Runs (root: string, env: NodeJS.ProcessEnv, work: string): Promise<void> {
  const emulator = qemu()
  const node = [emulator, '-L', root, join(root, 'nodejs/bin/node'), ...ENTRYPOINT.slice(1, -1), join(root, BUNDLE)]
  const v = sh(node[0] ?? '', [...node.slice(1), '--version'], { env, timeoutMs: scaled(120_000) })
  equal(v.stdout.trim(), `cos-auth-proxy ${VERSION}`, `linux/arm64: qemu-aarch64-static -L <root> <root>/nodejs/bin/node <root>/${BUNDLE} --version says ${v.stdout.trim() || v.stderr.trim().slice(0, 200)}`)

  const creds = mkdtempSync(join(work, 'creds-'))
  const accessKey = 'AKIDPLATFORMTEST'
  const secret = `platform-${createHash('sha256').update(String(process.hrtime.bigint())).digest('hex').slice(0, 24)}`
  writeFileSync(join(creds, 'access-key'), `${accessKey}\n`, { mode: 0o600 })
  writeFileSync(join(creds, 'access-key-secret'), `${secret}\n`, { mode: 0o600 })
  const [mockPort, proxyPort, adminPort] = [await freePort(), await freePort(), await freePort()]
  const children: ChildProcess[] = []
  const logs = { mock: '', proxy: '' }
  const started = (cmd: string, args: string[], childEnv: NodeJS.ProcessEnv, log: 'mock' | 'proxy'): ChildProcess => {
    const child = spawn(cmd, args, { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] })
    const keep = (b: Buffer): void => { logs[log] = (logs[log] + b.toString()).slice(-6000) }
    child.stdout.on('data', keep)
    child.stderr.on('data', keep)
    children.push(child)
    return child
  }
  try {
    // The upstream: the same bundle's mock COS API, which answers only requests whose token
    // it verifies with the same credentials, on this machine's node.
    started(process.execPath, [join(root, BUNDLE), 'mock-api', '--port', String(mockPort)],
      { PATH: process.env.PATH, COS_ACCESS_KEY: accessKey, COS_ACCESS_KEY_SECRET: secret, COS_MOCK_HOST: '127.0.0.1' }, 'mock')
    const proxy = started(node[0] ?? '', [...node.slice(1), 'serve'], {
      ...env,
      COS_LISTEN_PORT: String(proxyPort),
      COS_ADMIN_PORT: String(adminPort),
      COS_MANAGEMENT_API_URL: `http://127.0.0.1:${mockPort}/management`,
      COS_OPTIMIZE_API_URL: `http://127.0.0.1:${mockPort}/optimize`,
      COS_ACCESS_KEY_FILE: join(creds, 'access-key'),
      COS_ACCESS_KEY_SECRET_FILE: join(creds, 'access-key-secret'),
      COS_SHUTDOWN_DELAY_MS: '0',
      COS_SHUTDOWN_TIMEOUT_MS: '5000',
    }, 'proxy')
    const ready = await poll(`http://127.0.0.1:${adminPort}/readyz`, scaled(90_000), () => proxy.exitCode === null)
    if (!ok(ready === 200, `linux/arm64: serve under qemu-user: admin /readyz ${ready ?? 'no answer'}`, logs.proxy.slice(-1500))) return
    const url = `http://127.0.0.1:${proxyPort}/management/v1/clusters`
    const r = await fetch(url, { signal: AbortSignal.timeout(scaled(30_000)) }).then(async res => ({ status: res.status, body: await res.text() }), (err: unknown) => ({ status: 0, body: String(err) }))
    ok(r.status === 200 && r.body.includes('"items"'), `linux/arm64: GET /management/v1/clusters through it, signed, to the mock API on loopback: ${r.status}`,
      { body: r.body.slice(0, 300), proxy: logs.proxy.slice(-1500), mock: logs.mock.slice(-800) })
    ok(!`${logs.proxy}${logs.mock}`.includes(secret), 'linux/arm64: the secret is in neither process\'s output')
    const exited = proxy.exitCode !== null ? Promise.resolve(proxy.exitCode) : new Promise<number | null>(resolve => proxy.once('exit', c => { resolve(c) }))
    proxy.kill('SIGTERM')
    const code = await Promise.race([exited, sleep(scaled(30_000), undefined, { ref: false }).then(() => 'timeout' as const)]) // unref'd: the race's loser must not hold the run open
    ok(code === 0, `linux/arm64: SIGTERM: drained and exited ${String(code)}`, logs.proxy.slice(-800))
  } finally {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    rmSync(creds, { recursive: true, force: true })
  }
}

/** GETs url until it answers (its status), while alive() holds, for at most ms. */
async function poll (url: string, ms: number, alive: () => boolean): Promise<number | undefined> {
  const end = Date.now() + ms
  while (Date.now() < end && alive()) {
    const status = await fetch(url, { signal: AbortSignal.timeout(2000) }).then(r => r.status, () => undefined)
    if (status !== undefined) return status
    await sleep(250)
  }
  return undefined
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const ref = process.argv[2] ?? ''
  if (!/@sha256:[0-9a-f]{64}$/.test(ref)) {
    console.log('usage: node --import tsx test/e2e/release/platforms.ts REG/cos-auth-proxy@sha256:<index digest>')
    process.exit(2)
  }
  const get = sh('bash', [join(ROOT, 'scripts/tools/get-go-tool.sh'), 'crane'], { timeoutMs: 1_800_000 })
  const insecure = /^(127\.|localhost[:/]|\[::1\])/.test(ref)
  await platformContent({ crane: get.stdout.trim(), ref, insecure }).catch((err: unknown) => { ok(false, err instanceof Error ? err.message : String(err)) })
}
