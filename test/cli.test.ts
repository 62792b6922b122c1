// The CLI as users run it: the built dist/cli.js in a child process.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { startForwardProxy } from './forward-proxy.js'
import { ACCESS_KEY, SECRET, json, send, startUpstream } from './helpers.js'

const CLI = fileURLToPath(new URL('../dist/cli.js', import.meta.url))
// An empty working directory, so no stray .env is read.
const CWD = mkdtempSync(join(tmpdir(), 'cos-cli-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

const CREDS = { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET: SECRET }

function childEnv (env: Record<string, string>): NodeJS.ProcessEnv {
  // Ephemeral admin port: test files run in parallel.
  return { PATH: process.env.PATH, COS_ADMIN_PORT: '0', ...env }
}

interface Result { code: number | null, stdout: string, stderr: string }

function run (args: string[], env: Record<string, string>): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { cwd: CWD, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
    child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000)
    child.on('error', reject)
    child.on('close', code => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
  })
}

interface Daemon { child: ChildProcessWithoutNullStreams, stdout: () => string, stderr: () => string, exited: Promise<number | null> }

/** Starts a long-running command and waits until `ready` matches its output. */
async function start (args: string[], env: Record<string, string>, ready: RegExp): Promise<{ daemon: Daemon, match: RegExpMatchArray }> {
  const child = spawn(process.execPath, [CLI, ...args], { cwd: CWD, env: childEnv(env) })
  let out = ''
  let err = ''
  const exited = new Promise<number | null>(resolve => child.on('close', code => resolve(code)))
  const daemon = { child, stdout: () => out, stderr: () => err, exited }
  const match = await new Promise<RegExpMatchArray>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`not ready: ${out}${err}`)) }, 15_000)
    const check = (): void => {
      const m = (out + err).match(ready)
      if (m) { clearTimeout(timer); resolve(m) }
    }
    child.stdout.on('data', (d: Buffer) => { out += d.toString(); check() })
    child.stderr.on('data', (d: Buffer) => { err += d.toString(); check() })
    void exited.then(code => { clearTimeout(timer); reject(new Error(`exited ${code}: ${out}${err}`)) })
  })
  return { daemon, match }
}

const VECTOR = { args: ['--timestamp', '1700000000000000000', '--nonce', '0123456789abcdef0123456789abcdef'], env: { COS_ACCESS_KEY: 'AKIDEXAMPLE', COS_ACCESS_KEY_SECRET: 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY' } }

t.test('token prints the spec vector, encoded or raw', async t => {
  const encoded = await run(['token', ...VECTOR.args], VECTOR.env)
  t.equal(encoded.code, 0)
  t.equal(encoded.stdout, 'AKIDEXAMPLE%2F1700000000000000000%2F0123456789abcdef0123456789abcdef%2FNhCKVQ6%2BPLT1iIAIpmxmvBc22Mee%2FuRrpIlpowzJpaA%3D\n')
  const raw = await run(['token', ...VECTOR.args, '--raw'], VECTOR.env)
  t.equal(raw.stdout, 'AKIDEXAMPLE/1700000000000000000/0123456789abcdef0123456789abcdef/NhCKVQ6+PLT1iIAIpmxmvBc22Mee/uRrpIlpowzJpaA=\n')
  const none = await run(['token', ...VECTOR.args], { ...VECTOR.env, COS_TOKEN_ENCODING: 'none' })
  t.equal(none.stdout, raw.stdout, 'COS_TOKEN_ENCODING=none prints the raw form')
})

t.test('token then verify: fresh tokens verify; tampered, foreign and stale ones do not', async t => {
  const fresh = await run(['token'], CREDS)
  t.equal(fresh.code, 0)
  const token = fresh.stdout.trim()
  t.match(token, /^AKIDTEST%2F\d{19}%2F[0-9a-f]{32}%2F/)

  const ok = await run(['verify', token], CREDS)
  t.equal(ok.code, 0, ok.stderr)
  t.match(ok.stdout, /^valid: access key AKIDTEST/)

  const rawToken = (await run(['token', '--raw'], CREDS)).stdout.trim()
  t.equal((await run(['verify', rawToken, '--max-age', '60'], CREDS)).code, 0, 'raw form accepted')

  // Flip the nonce's first character: the shape stays valid, the signature no longer matches.
  const tampered = token.replace(/%2F([0-9a-f])([0-9a-f]{31})%2F/, (_m, c: string, rest: string) => `%2F${c === 'a' ? 'b' : 'a'}${rest}%2F`)
  t.not(tampered, token)
  const bad = await run(['verify', tampered], CREDS)
  t.equal(bad.code, 1)
  t.match(bad.stderr, /bad_signature/)

  const otherSecret = await run(['verify', token], { ...CREDS, COS_ACCESS_KEY_SECRET: 'another' })
  t.equal(otherSecret.code, 1)
  t.match(otherSecret.stderr, /bad_signature/)

  const otherKey = await run(['verify', token], { ...CREDS, COS_ACCESS_KEY: 'SOMEONEELSE' })
  t.equal(otherKey.code, 1)
  t.match(otherKey.stderr, /wrong_key/)

  const old = (await run(['token', '--timestamp', '1700000000000000000'], CREDS)).stdout.trim()
  const stale = await run(['verify', old, '--max-age', '300'], CREDS)
  t.equal(stale.code, 1)
  t.match(stale.stderr, /stale/)
  t.equal((await run(['verify', old], CREDS)).code, 0, 'without --max-age age is not checked')

  const garbage = await run(['verify', 'not-a-token'], CREDS)
  t.equal(garbage.code, 1)
  t.match(garbage.stderr, /malformed/)

  for (const r of [fresh, ok, bad, otherSecret, otherKey, stale, garbage]) t.notOk((r.stdout + r.stderr).includes(SECRET))
})

t.test('config prints the effective configuration with the secret redacted', async t => {
  const r = await run(['config'], { ...CREDS, COS_OPTIMIZE_API_URL: 'https://o.example.com/api/v1' })
  t.equal(r.code, 0)
  const c = JSON.parse(r.stdout) as { routes: { name: string, url: string }[], credentials: { secret: { value: string } } }
  t.same(c.routes.map(x => [x.name, x.url]), [['optimize', 'https://o.example.com/api/v1']])
  t.equal(c.credentials.secret.value, '[redacted]')
  t.notOk(r.stdout.includes(SECRET))
})

t.test('a bad config exits 78 with one line naming the variable', async t => {
  const cases: [string[], Record<string, string>, RegExp][] = [
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_LISTEN_PORT: 'eighty' }, /COS_LISTEN_PORT/],
    [['serve'], CREDS, /COS_API_URL/],
    [[], { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY: ACCESS_KEY }, /COS_ACCESS_KEY_SECRET_FILE/],
    [['token'], { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET_FILE: '/nonexistent/secret' }, /COS_ACCESS_KEY_SECRET_FILE cannot read/],
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_CA_FILE: '/nonexistent/ca.pem' }, /COS_CA_FILE cannot read/],
    [['config'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_TOKEN_ENCODING: 'hex' }, /COS_TOKEN_ENCODING/],
    [['token'], { COS_ACCESS_KEY_SECRET: SECRET }, /COS_ACCESS_KEY_FILE/],
  ]
  for (const [args, env, variable] of cases) {
    const r = await run(args, env)
    t.equal(r.code, 78, `${args.join(' ')}: ${r.stderr.trim()}`)
    t.equal(r.stderr.split('\n').filter(l => l !== '').length, 1, 'one line')
    t.match(r.stderr, variable)
    t.equal(r.stdout, '')
    t.notOk(r.stderr.includes(SECRET))
  }
})

t.test('usage errors exit 64', async t => {
  const unknown = await run(['frobnicate'], CREDS)
  t.equal(unknown.code, 64)
  t.match(unknown.stderr, /unknown command "frobnicate"/)
  const badFlag = await run(['token', '--nonce', 'XYZ'], CREDS)
  t.equal(badFlag.code, 64)
  t.match(badFlag.stderr, /--nonce/)
})

t.test('serve: logs the bound address, forwards with a token, exits 0 on SIGTERM', async t => {
  const up = await startUpstream()
  t.teardown(() => up.close())
  const { daemon, match } = await start(['serve'], { ...CREDS, COS_API_URL: up.url, COS_LISTEN_PORT: '0' }, /"port":(\d+)[^\n]*cos-auth-proxy listening/)
  const port = match[1] ?? ''
  const res = await send(`http://127.0.0.1:${port}/hello`)
  t.equal(res.status, 200)
  t.match(up.received[0]?.headers.authorization, /^Bearer AKIDTEST%2F/)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const lines = daemon.stdout().split('\n').filter(l => l !== '').map(l => JSON.parse(l) as Record<string, unknown>)
  t.ok(lines.some(l => l.msg === 'request' && l.status === 200), 'request line logged')
  t.ok(lines.every(l => typeof l.level === 'string' && typeof l.time === 'string'), 'JSON lines with level and time')
  t.notOk(daemon.stdout().includes(SECRET))
})

t.test('mock-api verifies tokens minted by the token command', async t => {
  const { daemon, match } = await start(['mock-api', '--port', '0'], CREDS, /"port":(\d+)[^\n]*mock COS API listening/)
  t.teardown(() => daemon.child.kill('SIGKILL'))
  const base = `http://127.0.0.1:${match[1] ?? ''}`
  const unauthenticated = await send(`${base}/management/v1/clusters`)
  t.equal(unauthenticated.status, 401)
  const token = (await run(['token'], CREDS)).stdout.trim()
  const ok = await send(`${base}/management/v1/clusters`, { headers: { authorization: `Bearer ${token}` } })
  t.equal(ok.status, 200)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
})

t.test('demo needs no configuration and serves the sample routes through the proxy', async t => {
  const { daemon, match } = await start(['demo'], { COS_LISTEN_PORT: '0' }, /proxy\s+(http:\/\/127\.0\.0\.1:\d+)/)
  t.teardown(() => daemon.child.kill('SIGKILL'))
  const proxy = match[1] ?? ''
  for (const path of ['/management/v1/clusters', '/management/v1/notification-rules', '/optimize/v1/workloads/recommendations']) {
    const res = await send(proxy + path)
    t.equal(res.status, 200, path)
    t.match(res.headers['content-type'], /json/)
  }
  const echo = await send(`${proxy}/echo`, { method: 'POST', body: '{"hello":"world"}', headers: { 'content-type': 'application/json' } })
  t.equal(echo.status, 200)
  t.match(json(echo), { method: 'POST', url: '/echo' })
  t.match(daemon.stderr(), /curl -s http:\/\/127\.0\.0\.1:\d+\/management\/v1\/clusters/)
  daemon.child.kill('SIGINT')
  t.equal(await daemon.exited, 0)
})

t.test('the egress proxy password never appears in the start line, error bodies, metrics or `config`; the start line shows it redacted', async t => {
  const password = 'EgReSs-PaSs-marker'
  const egress = await startForwardProxy({ credentials: { user: 'egress-user', password } })
  const up = await startUpstream()
  t.teardown(async () => { await egress.close(); await up.close() })
  const env = { ...CREDS, COS_API_URL: `http://cos-api.invalid:${new URL(up.url).port}`, HTTP_PROXY: `http://egress-user:${password}@127.0.0.1:${egress.port}`, COS_LOG_LEVEL: 'debug' }
  const shown = `http://egress-user:[redacted]@127.0.0.1:${egress.port}`

  const config = await run(['config'], env)
  t.equal(config.code, 0)
  t.match(JSON.parse(config.stdout), { egress: { http: { variable: 'HTTP_PROXY', address: `http://127.0.0.1:${egress.port}`, url: shown, authorization: '[redacted]' }, noProxy: [] } })

  const { daemon, match } = await start(['serve'], env, /[^\n]*cos-auth-proxy listening[^\n]*/)
  t.teardown(() => daemon.child.kill('SIGKILL'))
  const listening = JSON.parse(match[0]) as { port: number, admin: { port: number }, routes: unknown[] }
  t.same(listening.routes, [{ name: 'api', prefix: '/', upstream: `${env.COS_API_URL}/`, egressProxy: shown }], 'the route names its egress proxy, redacted')
  const ok = await send(`http://127.0.0.1:${listening.port}/x`)
  t.equal(ok.status, 200, 'through the egress proxy, with its credentials, from the real environment')
  t.equal(egress.saw[0]?.headers['proxy-authorization'], `Basic ${Buffer.from(`egress-user:${password}`).toString('base64')}`)
  await egress.close()
  const failed = await send(`http://127.0.0.1:${listening.port}/x`)
  t.equal(failed.status, 502)
  t.same(json(failed), { error: { code: 'upstream_unavailable', message: `the egress proxy http://127.0.0.1:${egress.port} could not be reached` } })
  const metrics = await send(`http://127.0.0.1:${listening.admin.port}/metrics`)
  t.equal(metrics.status, 200)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const everything = [config.stdout, config.stderr, daemon.stdout(), daemon.stderr(), ok.body.toString(), failed.body.toString(), metrics.body.toString()].join('\n')
  t.notOk(everything.includes(password), 'the password is nowhere')
  t.notOk(everything.includes(Buffer.from(`egress-user:${password}`).toString('base64')), 'nor its Basic form')
})

t.test('a malformed HTTPS_PROXY exits 78 naming the variable, without echoing its credentials', async t => {
  const r = await run(['serve'], { ...CREDS, COS_API_URL: 'https://api.example.com', HTTPS_PROXY: 'socks5://user:pw-marker@proxy.example.com:1080' })
  t.equal(r.code, 78)
  t.equal(r.stderr.trim(), 'cos-auth-proxy: config: HTTPS_PROXY must be an http:// or https:// proxy URL (got "socks5")')
  t.equal(r.stdout, '')
})
