// The compose companion brought up for real (issue 36): examples/compose.yaml, unedited, run by
// a real compose engine (Debian's docker-compose 1.29 against podman 4's Docker-compatible API,
// `podman system service`) inside a network namespace of its own (scripts/compose-engine.sh),
// with the image the packaging step built and a local stand-in for the curl image. In order:
//   example.ts   the example with the demo credentials and test/e2e/compose/outsider.yaml: the app
//                only once the proxy is healthy, 200 from the mock API through the proxy, 403
//                and nothing forwarded for anyone but the app (another network, the host from
//                the bridge's gateway, a neighbour on the app's network) and for the app under
//                a rebound Host, the admin port on 127.0.0.1:9090, `down` (proofs 1, 2, 3, 4, 6)
//   rotation.ts  the README's "real API" recipe (`up -d app`, COS_*_API_URL set): the key pair
//                rewritten on the host under the running proxy with no failed request, a rename
//                over it not seen, `down` (proofs 5, 6)
// and the engine's `down`, which must leave the host as it was.
//
// A tap file, not part of `npm test` (that runs test/**/*.test.ts). Run as root:
//   npm run test:compose
// Without root, the engine's packages or the image it is one skipped test that says what is
// missing and how to get it (CI counts a skip as a failure).
// env: COS_COMPOSE_IMAGE (the project's image in the host's podman store, default
// localhost/cos-auth-proxy:ci), COS_COMPOSE_TIMEOUT_S (default 900).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parse } from 'yaml'
import { equal, ok, section, suite } from '../harness/checks.js'
import { seconds, sh, type Run } from '../harness/processes.js'
import { compose, ENGINE, engineDown, engineUp, EXAMPLE, indent, killRunning, leaked, OUTSIDER, say, type Engine } from './engine.js'
import { example } from './example.js'
import { rotation } from './rotation.js'

const IMAGE = process.env.COS_COMPOSE_IMAGE ?? 'localhost/cos-auth-proxy:ci'
const PROJECT_IMAGE = 'cos-auth-proxy:local'
const CURL = /^(docker\.io\/)?curlimages\/curl:[\w.-]+$/

const hostView = (): { addr: string, netns: string[] } => ({
  addr: sh('ip', ['-o', 'addr']).stdout,
  netns: sh('ip', ['netns', 'list']).stdout.trim().split('\n').filter(l => l !== '').map(l => l.split(' ')[0] ?? '').sort(),
})

/** The images the example names: the project's (copied from IMAGE) and stand-ins for the rest. */
function imagesOfExample (): string[] {
  const doc = parse(readFileSync(EXAMPLE, 'utf8')) as { services?: Record<string, { image?: string }> }
  const names = [...new Set(Object.values(doc.services ?? {}).flatMap(s => s.image === undefined ? [] : [s.image]))]
  return names.flatMap(n => {
    if (n === PROJECT_IMAGE) return ['--image', `${IMAGE}=${n}`]
    if (CURL.test(n)) return ['--curl-standin', n]
    throw new Error(`examples/compose.yaml names ${n}: no local stand-in for it (no registry is reachable); add one to scripts/compose-engine.sh`)
  })
}

let work = ''
let before: ReturnType<typeof hostView> | undefined
let engine: Engine | undefined
const children: Array<{ stop: () => void }> = []
let stopped = false
const t0 = Date.now()

/** Everything down (once): what a failed or interrupted check left, the engine, the work directory. */
function stop (): Run | undefined {
  if (stopped) return undefined
  stopped = true
  killRunning()
  for (const c of children) c.stop()
  let r: Run | undefined
  if (engine !== undefined) {
    // Whatever a failed or interrupted check left up (normally nothing: each part ends with down).
    compose(engine, { files: [EXAMPLE, OUTSIDER], env: {} }, ['down', '-t', '5'], 120_000)
    r = engineDown(engine)
    say(`${r.stdout}${r.stderr}`.trim())
  }
  if (work !== '') rmSync(work, { recursive: true, force: true })
  return r
}

suite('compose', {
  prerequisites: [
    () => process.getuid?.() !== 0 ? { why: 'not root', how: 'run as root (network namespace, rootful podman)' } : undefined,
    () => {
      const missing = sh('bash', [ENGINE, 'missing'])
      return missing.code === 0 ? undefined : { why: `missing: ${missing.stdout.trim().replaceAll('\n', ', ')}`, how: 'install them (Debian packages):\n  bash scripts/compose-engine.sh install' }
    },
    () => sh('podman', ['image', 'exists', IMAGE]).code === 0
      ? undefined
      : { why: `no podman image ${IMAGE}`, how: `build it as the packaging step does (~3 min), or name another with COS_COMPOSE_IMAGE:\n  bash scripts/tools/container-smoke.sh -t ${IMAGE} --build-only --keep Dockerfile .` },
  ],
  timeoutS: Number(process.env.COS_COMPOSE_TIMEOUT_S ?? '900'),
  stop: () => { stop() },
  setUp: async () => {
    const images = imagesOfExample()
    before = hostView()
    work = mkdtempSync(join(tmpdir(), 'cos-compose-'))
    const up = engineUp(images)
    say(indent(up.output.replace(/^export .*$/gm, '')))
    engine = up.engine
    ok(engine !== undefined, `scripts/compose-engine.sh up: namespace ${engine?.netns ?? '?'}, podman system service, ${IMAGE} as ${PROJECT_IMAGE}, stand-ins (${seconds(t0)})`)
    if (engine === undefined) throw new Error('scripts/compose-engine.sh up failed (its output above)')
    const info = sh('bash', [ENGINE, 'exec', 'podman', 'info', '--format', '{{.Host.NetworkBackend}} {{.Store.GraphRoot}}'], { env: { ...process.env, COS_COMPOSE_RUN: engine.run } }).stdout.trim()
    ok(info.startsWith(`cni ${engine.run}/`), `podman's store and CNI configs are the run's own (${info})`)
    equal(hostView(), { addr: before.addr, netns: [...before.netns, engine.netns].sort() }, 'the host\'s addresses unchanged; one namespace more, the run\'s')
    return engine
  },
}, async e => {
  await example(e, work)
  await rotation(e, work, child => { children.push(child) })

  await section('engine down: the host as before', async () => {
    const t = Date.now()
    const r = stop()
    ok(r?.code === 0, `scripts/compose-engine.sh down: nothing left in the namespace, the namespace deleted, the host as its snapshot (${seconds(t)})`, r?.stderr.trim())
    equal(hostView(), before, '`ip -o addr` and `ip netns list` identical to before')
    equal(leaked(), [], 'no secret in anything this runner read or printed')
  })
  console.log(`compose: ${seconds(t0)} in all`)
})
