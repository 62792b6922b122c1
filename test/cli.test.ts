// The CLI as users run it: the bundle that ships (dist/cos-auth-proxy.mjs) in a child process.
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { CREDS, run, start } from './support/cli-process.js'
import { ACCESS_KEY, SECRET, json, jsonLines, send, startUpstream } from './support/helpers.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
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

t.test('config with nothing set shows the defaults, then says what serve would need (exit 78)', async t => {
  const r = await run(['config'], {})
  t.equal(r.code, 78)
  const c = JSON.parse(r.stdout) as { listen: { port: number }, admin: { port: number }, routes: unknown[] }
  t.equal(c.listen.port, 8080, 'the defaults are shown')
  t.same(c.routes, [])
  t.match(r.stderr, /^cos-auth-proxy: config: COS_API_URL or COS_MANAGEMENT_API_URL or COS_OPTIMIZE_API_URL is required/)
  t.equal(r.stderr.split('\n').filter(l => l !== '').length, 1, 'one line')
})

t.test('a bad config exits 78 with one line naming the variable', async t => {
  const cases: [string[], Record<string, string>, RegExp][] = [
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_LISTEN_PORT: 'eighty' }, /COS_LISTEN_PORT/],
    [['serve'], CREDS, /COS_API_URL/],
    [[], { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY: ACCESS_KEY }, /COS_ACCESS_KEY_SECRET_FILE/],
    [['token'], { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET_FILE: '/nonexistent/secret' }, /COS_ACCESS_KEY_SECRET_FILE cannot read/],
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_CA_FILE: '/nonexistent/ca.pem' }, /COS_CA_FILE cannot read/],
    [['config'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_TOKEN_ENCODING: 'hex' }, /COS_TOKEN_ENCODING/],
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_CLOCK_SKEW_CORRECTION: 'yes' }, /^cos-auth-proxy: config: COS_CLOCK_SKEW_CORRECTION must be true or false \(got "yes"\)$/m],
    [['token'], { COS_ACCESS_KEY_SECRET: SECRET }, /COS_ACCESS_KEY_FILE/],
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_LOG_FORMAT: 'text' }, /^cos-auth-proxy: config: COS_LOG_FORMAT must be one of json, pretty/m],
    [['demo'], { COS_LOG_FORMAT: 'colour' }, /COS_LOG_FORMAT/],
    // Contradictory timeouts: Node's RangeError (exit 1) before the check at load.
    [['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_REQUEST_TIMEOUT_MS: '5000' }, /^cos-auth-proxy: config: COS_REQUEST_TIMEOUT_MS .*COS_HEADERS_TIMEOUT_MS/],
    [['serve'], { ...CREDS, COS_API_URL: 'https://api.example.com', HTTPS_PROXY: `socks5://user:${encodeURIComponent(SECRET)}@proxy.example.com:1080` }, /HTTPS_PROXY must be an http:\/\/ or https:\/\/ proxy URL \(got "socks5"\)$/m],
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

t.test('ports in use: exit 78, one line naming COS_LISTEN_PORT and COS_ADMIN_PORT, both checked', async t => {
  const busy = await Promise.all([0, 1].map(async () => {
    const server = createServer()
    await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
    t.teardown(() => { server.close() })
    return (server.address() as AddressInfo).port
  }))
  const [listen = 0, admin = 0] = busy
  const r = await run(['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_LISTEN_PORT: String(listen), COS_ADMIN_PORT: String(admin) })
  t.equal(r.code, 78, r.stderr)
  t.equal(r.stderr.split('\n').filter(l => l !== '').length, 1, 'one line')
  t.match(r.stderr, new RegExp(`^cos-auth-proxy: config: COS_ADMIN_PORT ${String(admin)} on 127\\.0\\.0\\.1 is already in use .*\\(EADDRINUSE\\); COS_LISTEN_PORT ${String(listen)} on 127\\.0\\.0\\.1 is already in use .*: set each to a free port`))
  const one = await run(['serve'], { ...CREDS, COS_API_URL: 'http://127.0.0.1:1', COS_LISTEN_PORT: String(listen) })
  t.equal(one.code, 78)
  t.match(one.stderr, /^cos-auth-proxy: config: COS_LISTEN_PORT \d+ on 127\.0\.0\.1 is already in use .*: set it to a free port/, 'only the busy one named')
  t.notMatch(one.stderr, /COS_ADMIN_PORT/)
})

t.test('an unreadable key file: exit 78 naming the variable, the file\'s owner and mode, the user the process runs as, and the fix', async t => {
  const dir = mkdtempSync(join(tmpdir(), 'cos-perm-'))
  t.teardown(() => { rmSync(dir, { recursive: true, force: true }) })
  const secret = join(dir, 'access-key-secret')
  writeFileSync(secret, SECRET, { mode: 0o000 })
  // Root reads any file through its capabilities: the child runs without them (still uid 0), as the image's user would.
  const r = await run(['token'], { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET_FILE: secret }, { withoutCapabilities: process.getuid?.() === 0 })
  t.equal(r.code, 78, r.stderr)
  t.equal(r.stderr.split('\n').filter(l => l !== '').length, 1, 'one line')
  const uid = String(process.getuid?.())
  const gid = String(process.getgid?.())
  t.match(r.stderr, new RegExp(`^cos-auth-proxy: config: COS_ACCESS_KEY_SECRET_FILE cannot read ".*access-key-secret" \\(EACCES\\): the file is owned by uid ${uid} gid ${gid} with mode 0000, and this process runs as uid ${uid} gid ${gid}`))
  t.match(r.stderr, /defaultMode.*fsGroup/, 'the fix, for Kubernetes')
  t.notOk(r.stderr.includes(SECRET))
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
  const { daemon, match } = await start(['serve'], { ...CREDS, COS_API_URL: up.url, COS_LISTEN_PORT: '0', COS_ACCESS_LOG: 'all' }, /"port":(\d+)[^\n]*cos-auth-proxy listening/)
  const port = match[1] ?? ''
  const res = await send(`http://127.0.0.1:${port}/hello`)
  t.equal(res.status, 200)
  t.match(up.received[0]?.headers.authorization, /^Bearer AKIDTEST%2F/)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const lines = jsonLines(daemon.stdout())
  t.ok(lines.some(l => l.msg === 'request' && l.status === 200), 'request line logged')
  t.ok(lines.every(l => typeof l.level === 'string' && typeof l.time === 'string'), 'JSON lines with level and time')
  t.notOk(daemon.stdout().includes(SECRET))
})

// One readable line per event: time, level, message, then key=value.
const PRETTY_LINE = /^\d\d:\d\d:\d\d\.\d{3} (FATAL|ERROR|WARN |INFO |DEBUG|TRACE) \S/

t.test('serve with COS_LOG_FORMAT=pretty writes one readable line per event, and no secret', async t => {
  const up = await startUpstream()
  t.teardown(() => up.close())
  const { daemon, match } = await start(['serve'], { ...CREDS, COS_API_URL: up.url, COS_LISTEN_PORT: '0', COS_LOG_FORMAT: 'pretty', COS_ACCESS_LOG: 'all' }, / port=(\d+)[^\n]*/)
  const res = await send(`http://127.0.0.1:${match[1] ?? ''}/hello`)
  t.equal(res.status, 200)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const lines = daemon.stdout().split('\n').filter(l => l !== '')
  t.ok(lines.length >= 4, `${lines.length} lines`)
  for (const line of lines) t.match(line, PRETTY_LINE, line)
  t.ok(lines.some(l => /^\S+ INFO {2}cos-auth-proxy listening address=127\.0\.0\.1 port=\d+ /.test(l)), 'the start line')
  t.ok(lines.some(l => /INFO {2}request .*status=200/.test(l)), 'the request line')
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
  // The demo's pretty lines are counted like JSON ones: operations.md lists the metric for every format.
  const adminPort = /admin=\{"address":"127\.0\.0\.1","port":(\d+)\}/.exec(daemon.stdout())?.[1]
  t.ok(adminPort, 'the listening line names the admin port')
  t.match((await send(`http://127.0.0.1:${adminPort ?? '0'}/metrics`)).body.toString(), /^cos_auth_proxy_log_lines_dropped_total 0$/m, 'cos_auth_proxy_log_lines_dropped_total under COS_LOG_FORMAT=pretty')
  daemon.child.kill('SIGINT')
  t.equal(await daemon.exited, 0)
  const lines = daemon.stdout().split('\n').filter(l => l !== '')
  t.ok(lines.some(l => /INFO {2}request .*status=200/.test(l)), 'a person reads the demo: pretty lines by default')
  t.notOk(lines.some(l => l.startsWith('{')), 'no JSON lines')
})

t.test('a test killed outright leaves no CLI child behind (test/support/node-child.ts)', { skip: process.platform === 'linux' ? false : 'setpriv --pdeathsig is Linux only' }, async t => {
  // A stand-in for a test file that tap's timeout kills: it starts a child as the tests do, then is SIGKILLed.
  const script = `import('./test/support/node-child.ts').then(m => { const c = m.spawnNode(['-e', 'setInterval(() => {}, 1000)']); console.log(c.pid) })`
  const parent = spawn(process.execPath, ['--import', 'tsx', '-e', script], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => { parent.kill('SIGKILL') })
  const pid = await new Promise<number>(resolve => parent.stdout.once('data', (d: Buffer) => { resolve(Number(d.toString().trim())) }))
  t.ok(running(pid), `the child ${String(pid)} runs`)
  parent.kill('SIGKILL')
  for (let i = 0; i < 100 && running(pid); i++) await new Promise(resolve => setTimeout(resolve, 50))
  if (running(pid)) process.kill(pid, 'SIGKILL')
  t.notOk(running(pid), 'the child is gone within 5 s of its parent')
})

/** Alive and not a zombie waiting for a reaper (/proc/<pid>/stat's state). */
function running (pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${String(pid)}/stat`, 'utf8'))
  } catch {
    return false
  }
}
