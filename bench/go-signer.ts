// The Go yardstick (issue 21): bench/go-signer/main.go, built here with the
// machine's `go` (standard library only, offline, a throwaway build cache),
// started as the other servers are, and checked against the project's own
// token verifier (src/mock-api/mock-api.ts) before anything is measured: a yardstick
// whose requests the real API would refuse measures nothing.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { Agent, get as httpGet } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { buildMockApi } from '../src/mock-api/mock-api.js'
import { parseToken, secretKey } from '../src/token/token.js'
import { firstJsonLine, spawnProgram, stopChild, waitFor200 } from './support/children.js'
import { cpuMs } from './support/machine.js'
import { BENCH_DIR } from './support/node.js'
import type { Server } from './support/servers.js'

export type GoSigner =
  | { readonly binary: string, readonly go: string }
  | { readonly skipped: string }

/** Builds the signer into `scratch`, or says why it is skipped (no `go` on PATH). */
export function buildGoSigner (scratch: string): GoSigner {
  let go: string
  try {
    go = execFileSync('go', ['version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
  } catch {
    return { skipped: 'no `go` on PATH (Debian: apt-get install golang-go)' }
  }
  const binary = join(scratch, 'go-signer')
  execFileSync('go', ['build', '-trimpath', '-o', binary, '.'], {
    cwd: join(BENCH_DIR, 'go-signer'),
    // Offline and self-contained: no module proxy (there are no modules to
    // fetch), no toolchain download, no cgo, a build cache that goes with the scratch directory.
    env: { PATH: process.env.PATH, HOME: scratch, GOCACHE: join(scratch, 'go-cache'), GOPATH: join(scratch, 'go-path'), GOFLAGS: '', GOPROXY: 'off', GOTOOLCHAIN: 'local', CGO_ENABLED: '0' },
    stdio: ['ignore', 'ignore', 'inherit'],
  })
  return { binary, go }
}

export interface GoSignerStart {
  readonly binary: string
  readonly upstreamUrl: string
  readonly core: number | undefined
  readonly accessKey?: string
  readonly secret?: string
  /** A cgroup to run in (bench:accept --limit). */
  readonly cgroup?: string
}

/** One Go signer on GOMAXPROCS=1 (one core's worth, as one Node process), answering through the upstream. */
export async function startGoSigner (s: GoSignerStart): Promise<Server> {
  const t0 = performance.now()
  const child = spawnProgram('go-signer', s.binary, [], {
    env: {
      PATH: process.env.PATH,
      GOMAXPROCS: '1',
      BENCH_UPSTREAM: s.upstreamUrl,
      COS_ACCESS_KEY: s.accessKey ?? 'bench-access-key',
      COS_ACCESS_KEY_SECRET: s.secret ?? randomBytes(30).toString('base64'),
    },
    ...(s.core === undefined ? {} : { core: s.core }),
    ...(s.cgroup === undefined ? {} : { cgroup: s.cgroup }),
  })
  const ready = await firstJsonLine(child)
  const readyMs = performance.now() - t0
  const readyCpuMs = cpuMs(child.pid)
  const url = `http://127.0.0.1:${String(ready.port)}`
  return { child, url, readyMs, readyCpuMs }
}

function statusesOf (url: string, count: number): Promise<number[]> {
  const agent = new Agent({ keepAlive: true, maxSockets: 4 })
  return Promise.all(Array.from({ length: count }, () => new Promise<number>(resolve => {
    httpGet(url, { agent }, res => { res.resume(); res.on('end', () => resolve(res.statusCode ?? 0)) }).on('error', () => resolve(0))
  }))).finally(() => agent.destroy())
}

// Needs escaping (a space, a plus) so that QueryEscape is exercised on every field.
const CHECK_KEY = 'bench go+check key'
/** The proxy's header shape (src/token/token.ts, COS_TOKEN_ENCODING=url): no raw `/`, 32 hex characters of nonce. */
const URL_FORM = /^Bearer [A-Za-z0-9%+._~-]+%2F[0-9]{19}%2F[0-9a-f]{32}%2F[A-Za-z0-9%]{44,}$/

/**
 * Sends requests through the Go signer to the project's mock API (which
 * verifies signature, key, clock and replay) and throws unless every one is
 * accepted; then the same with a wrong secret, which must be refused, so the
 * check itself is shown to be able to fail.
 */
export async function checkGoSigner (binary: string): Promise<string> {
  const secret = randomBytes(30).toString('base64')
  const seen: string[] = []
  const mock = buildMockApi({ accessKey: CHECK_KEY, key: secretKey(secret) })
  mock.addHook('onRequest', (request, _reply, done) => { seen.push(request.headers.authorization ?? ''); done() })
  await mock.listen({ host: '127.0.0.1', port: 0 })
  const upstreamUrl = `http://127.0.0.1:${(mock.server.address() as AddressInfo).port}`
  try {
    const path = '/management/v1/clusters'
    const good = await startGoSigner({ binary, upstreamUrl, core: undefined, accessKey: CHECK_KEY, secret })
    let statuses: number[]
    try {
      await waitFor200(good.child, good.url + path, 5000)
      statuses = await statusesOf(good.url + path, 50)
    } finally {
      await stopChild(good.child)
    }
    const refused = statuses.filter(s => s !== 200)
    if (refused.length > 0) throw new Error(`Go signer: the mock API refused ${refused.length} of ${statuses.length} signed requests (statuses ${[...new Set(refused)].join(', ')})`)
    const header = seen.at(-1) ?? ''
    const parsed = parseToken(header)
    if (!URL_FORM.test(header) || !parsed.ok || parsed.fields.accessKey !== CHECK_KEY) throw new Error('Go signer: its Authorization header is not in the proxy\'s URL-encoded form')
    const bad = await startGoSigner({ binary, upstreamUrl, core: undefined, accessKey: CHECK_KEY, secret: secret + 'x' })
    let wrong: number[]
    try {
      wrong = await statusesOf(bad.url + path, 3)
    } finally {
      await stopChild(bad.child)
    }
    if (wrong.some(s => s !== 401)) throw new Error(`Go signer: with a wrong secret the mock API answered ${wrong.join(', ')}, not 401: the check cannot tell`)
    return `${statuses.length} requests signed by the Go signer accepted by the mock API's verifier; a wrong secret refused (401)`
  } finally {
    await mock.close()
  }
}
