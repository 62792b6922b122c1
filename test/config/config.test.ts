// Configuration: defaults, every validation rule, and the error line that names the variable.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { inspect } from 'node:util'
import t from 'tap'
import { ConfigError, describeConfig, loadConfig } from '../../src/config/config.js'
import { readPair } from '../../src/credentials/credentials.js'
import { verifyToken } from '../../src/token/token.js'

const SECRET = 'config-SeCrEt-marker'
const base = { COS_API_URL: 'https://api.example.com', COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET }
const load = (env: Record<string, string>, extra: { needs?: 'all' | 'credentials' | 'nothing' } = {}) => loadConfig({ env, dotenv: false, ...extra })

function errorOf (env: Record<string, string>): ConfigError {
  try {
    load(env)
  } catch (err) {
    if (err instanceof ConfigError) return err
    throw err
  }
  throw new Error('expected a ConfigError')
}

t.test('defaults', async t => {
  const c = load(base)
  t.same(c.listen, { host: '127.0.0.1', port: 8080 })
  t.equal(c.tokenEncoding, 'url')
  t.equal(c.upstreamTimeoutMs, 30000)
  t.equal(c.connectTimeoutMs, 5000)
  t.equal(c.upstreamMaxConnections, 256, 'upstream sockets per origin are bounded by default')
  t.equal(c.logLevel, 'info')
  t.equal(c.logFormat, 'json', 'JSON log lines unless COS_LOG_FORMAT asks for pretty')
  t.same(c.routes.map(r => r.name), ['api'])
  t.equal(c.clockSkewCorrection, false, 'clock skew correction off')
  t.ok(Object.isFrozen(c), 'frozen')
})

t.test('COS_LOG_FORMAT: json or pretty', async t => {
  t.equal(load({ ...base, COS_LOG_FORMAT: 'pretty' }).logFormat, 'pretty')
  t.equal(load({ ...base, COS_LOG_FORMAT: 'json' }).logFormat, 'json')
})

t.test('routes: prefixes, base paths, trailing slashes', async t => {
  const c = load({
    ...base,
    COS_MANAGEMENT_API_URL: 'https://m.example.com/',
    COS_OPTIMIZE_API_URL: 'http://o.example.com:8443/api/v1/',
    COS_OPTIMIZE_PATH_PREFIX: '/opt/',
  })
  t.same(c.routes.map(r => [r.name, r.prefix, r.origin, r.basePath]), [
    ['management', '/management', 'https://m.example.com', ''],
    ['optimize', '/opt', 'http://o.example.com:8443', '/api/v1'],
    ['api', '', 'https://api.example.com', ''],
  ])
})

t.test('each bad value exits with a line naming the variable', async t => {
  const cases: [Record<string, string>, string, RegExp][] = [
    [{ ...base, COS_LISTEN_PORT: 'abc' }, 'COS_LISTEN_PORT', /port number/],
    [{ ...base, COS_LISTEN_PORT: '70000' }, 'COS_LISTEN_PORT', /port number/],
    [{ ...base, COS_LISTEN_HOST: 'bad host!' }, 'COS_LISTEN_HOST', /IP address or host name/],
    [{ ...base, COS_API_URL: 'not a url' }, 'COS_API_URL', /absolute http\(s\) URL/],
    [{ ...base, COS_API_URL: 'ftp://x.example.com' }, 'COS_API_URL', /http or https/],
    [{ ...base, COS_API_URL: 'https://x.example.com/?a=1' }, 'COS_API_URL', /query/],
    [{ ...base, COS_API_URL: 'https://x.example.com/#f' }, 'COS_API_URL', /fragment/],
    [{ ...base, COS_API_URL: '/relative' }, 'COS_API_URL', /absolute/],
    [{ ...base, COS_MANAGEMENT_API_URL: 'https://u:p@m.example.com' }, 'COS_MANAGEMENT_API_URL', /user:password/],
    [{ ...base, COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: 'optimize' }, 'COS_OPTIMIZE_PATH_PREFIX', /must be a path/],
    [{ ...base, COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/' }, 'COS_OPTIMIZE_PATH_PREFIX', /must be a path/],
    [{ ...base, COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/a/*' }, 'COS_OPTIMIZE_PATH_PREFIX', /must be a path/],
    [{ ...base, COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/management/x' }, 'COS_OPTIMIZE_PATH_PREFIX', /overlap/],
    [{ ...base, COS_TOKEN_ENCODING: 'base64' }, 'COS_TOKEN_ENCODING', /url, none/],
    [{ ...base, COS_UPSTREAM_TIMEOUT_MS: '0' }, 'COS_UPSTREAM_TIMEOUT_MS', /milliseconds/],
    [{ ...base, COS_CONNECT_TIMEOUT_MS: '1.5' }, 'COS_CONNECT_TIMEOUT_MS', /milliseconds/],
    [{ ...base, COS_LOG_LEVEL: 'verbose' }, 'COS_LOG_LEVEL', /info/],
    [{ ...base, COS_LOG_FORMAT: 'text' }, 'COS_LOG_FORMAT', /must be one of json, pretty/],
    [{ ...base, COS_LOG_FORMAT: 'PRETTY' }, 'COS_LOG_FORMAT', /must be one of json, pretty/],
    [{ COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET }, 'COS_API_URL', /required/],
    [{ COS_API_URL: 'https://a.example.com', COS_ACCESS_KEY_SECRET: SECRET }, 'COS_ACCESS_KEY_FILE', /COS_ACCESS_KEY\) is required/],
    [{ COS_API_URL: 'https://a.example.com', COS_ACCESS_KEY: 'ak' }, 'COS_ACCESS_KEY_SECRET_FILE', /required/],
    [{ ...base, COS_ACCESS_KEY_FILE: '/k' }, 'COS_ACCESS_KEY_FILE', /both set/],
    [{ ...base, COS_ACCESS_KEY_SECRET_FILE: '/s' }, 'COS_ACCESS_KEY_SECRET_FILE', /both set/],
    [{ ...base, COS_ALLOW_FROM: '10.0.0.0' }, 'COS_ALLOW_FROM', /CIDRs/],
    [{ ...base, COS_ALLOW_FROM: '10.0.0.0/33' }, 'COS_ALLOW_FROM', /CIDRs/],
    [{ ...base, COS_ALLOW_FROM: 'fd00::/129' }, 'COS_ALLOW_FROM', /CIDRs/],
    [{ ...base, COS_ALLOW_FROM: 'example.com/8' }, 'COS_ALLOW_FROM', /CIDRs/],
    [{ ...base, COS_ALLOW_FROM: ' , ' }, 'COS_ALLOW_FROM', /at least one/],
    [{ ...base, COS_REQUIRE_HEADER: 'X Bad: 1' }, 'COS_REQUIRE_HEADER', /Header-Name/],
    [{ ...base, COS_REQUIRE_HEADER: 'X-Empty:' }, 'COS_REQUIRE_HEADER', /Header-Name/],
    [{ ...base, COS_API_ALLOWED_METHODS: 'GET,FETCH' }, 'COS_API_ALLOWED_METHODS', /FETCH/],
    [{ ...base, COS_API_ALLOWED_METHODS: 'GET,CONNECT' }, 'COS_API_ALLOWED_METHODS', /CONNECT/],
    [{ ...base, COS_MAX_BODY_BYTES: '-1' }, 'COS_MAX_BODY_BYTES', /bytes/],
    [{ ...base, COS_MAX_CONNECTIONS: '0' }, 'COS_MAX_CONNECTIONS', /connections/],
    [{ ...base, COS_UPSTREAM_MAX_CONNECTIONS: '0' }, 'COS_UPSTREAM_MAX_CONNECTIONS', /connections 1-65536/],
    [{ ...base, COS_UPSTREAM_MAX_CONNECTIONS: 'unbounded' }, 'COS_UPSTREAM_MAX_CONNECTIONS', /connections 1-65536/],
    [{ ...base, COS_ADMIN_MAX_CONNECTIONS: '0' }, 'COS_ADMIN_MAX_CONNECTIONS', /connections/],
    [{ ...base, COS_ADMIN_MAX_CONNECTIONS: 'few' }, 'COS_ADMIN_MAX_CONNECTIONS', /connections/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'null' }, 'COS_ALLOWED_ORIGINS', /must not list "null"/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'https://ok.example, *' }, 'COS_ALLOWED_ORIGINS', /origins like https:\/\/app\.example:3000 \(got "\*"\)/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'https://app.example/path' }, 'COS_ALLOWED_ORIGINS', /origins like/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'app.example:3000' }, 'COS_ALLOWED_ORIGINS', /origins like/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'https://user@app.example' }, 'COS_ALLOWED_ORIGINS', /origins like/],
    [{ ...base, COS_ALLOWED_ORIGINS: 'https://app.example:99999' }, 'COS_ALLOWED_ORIGINS', /origins like/],
    [{ ...base, COS_ALLOWED_HOSTS: 'proxy.internal:8080' }, 'COS_ALLOWED_HOSTS', /without a port/],
    [{ ...base, COS_ALLOWED_HOSTS: '[fd00::1]:80' }, 'COS_ALLOWED_HOSTS', /without a port/],
    [{ ...base, COS_ALLOWED_HOSTS: '*' }, 'COS_ALLOWED_HOSTS', /host names/],
    [{ ...base, COS_ALLOWED_HOSTS: 'user@proxy.internal' }, 'COS_ALLOWED_HOSTS', /host names/],
    [{ ...base, COS_ALLOWED_HOSTS: 'http://proxy.internal' }, 'COS_ALLOWED_HOSTS', /host names/],
    [{ ...base, COS_HEADERS_TIMEOUT_MS: 'soon' }, 'COS_HEADERS_TIMEOUT_MS', /milliseconds/],
    [{ ...base, COS_ADMIN_PORT: '8080' }, 'COS_ADMIN_PORT', /differ from COS_LISTEN_PORT/],
    [{ ...base, COS_CLIENT_CERT_FILE: '/c.pem' }, 'COS_CLIENT_KEY_FILE', /other half/],
    [{ ...base, COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/Management' }, 'COS_OPTIMIZE_PATH_PREFIX', /overlap COS_MANAGEMENT_PATH_PREFIX, also ignoring case/],
    [{ ...base, COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_MANAGEMENT_PATH_PREFIX: '/a', COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/a;v2/x' }, 'COS_OPTIMIZE_PATH_PREFIX', /overlap/],
    [{ ...base, COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/..' }, 'COS_OPTIMIZE_PATH_PREFIX', /only dots or ";params"/],
    [{ ...base, COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/opt/;v1' }, 'COS_OPTIMIZE_PATH_PREFIX', /only dots or ";params"/],
  ]
  for (const [env, variable, problem] of cases) {
    const err = errorOf(env)
    t.equal(err.variable, variable, `${variable}: ${err.message}`)
    t.ok(err.message.startsWith(variable + ' '), 'the line starts with the variable')
    t.match(err.message, problem)
    t.notOk(err.message.includes('\n'), 'one line')
    t.notOk(err.message.includes(SECRET), 'no secret')
  }
})

t.test('COS_CLOCK_SKEW_CORRECTION is a boolean: exactly true or false, anything else stops at load naming it', async t => {
  t.equal(load({ ...base, COS_CLOCK_SKEW_CORRECTION: 'true' }).clockSkewCorrection, true)
  t.equal(load({ ...base, COS_CLOCK_SKEW_CORRECTION: 'false' }).clockSkewCorrection, false)
  t.equal(load({ ...base, COS_CLOCK_SKEW_CORRECTION: '' }).clockSkewCorrection, false, 'empty is unset')
  for (const value of ['yes', '1', 'TRUE', 'on', ' true', 'true,false']) {
    const err = errorOf({ ...base, COS_CLOCK_SKEW_CORRECTION: value })
    t.equal(err.variable, 'COS_CLOCK_SKEW_CORRECTION', err.message)
    t.equal(err.message, `COS_CLOCK_SKEW_CORRECTION must be true or false (got ${JSON.stringify(value)})`)
  }
})

t.test('COS_CLOCK_SKEW_MAX_SECONDS: 600 by default, whole seconds 5-86400, anything else stops at load naming it', async t => {
  t.equal(load(base).clockSkewMaxSeconds, 600, 'twice the ±5 min window the mock API accepts')
  t.equal(load({ ...base, COS_CLOCK_SKEW_MAX_SECONDS: '5' }).clockSkewMaxSeconds, 5)
  t.equal(load({ ...base, COS_CLOCK_SKEW_MAX_SECONDS: '86400' }).clockSkewMaxSeconds, 86_400)
  t.equal(load({ ...base, COS_CLOCK_SKEW_MAX_SECONDS: '' }).clockSkewMaxSeconds, 600, 'empty is unset')
  for (const value of ['4', '0', '-600', '86401', '600.5', '10m', 'Infinity']) {
    const err = errorOf({ ...base, COS_CLOCK_SKEW_MAX_SECONDS: value })
    t.equal(err.variable, 'COS_CLOCK_SKEW_MAX_SECONDS', err.message)
    t.equal(err.message, `COS_CLOCK_SKEW_MAX_SECONDS must be a whole number of seconds 5-86400 (got ${JSON.stringify(value)})`)
  }
})

t.test('"Infinity" is no whole number: every integer setting refuses it, naming the variable', async t => {
  for (const name of ['COS_LISTEN_PORT', 'COS_UPSTREAM_TIMEOUT_MS', 'COS_MAX_BODY_BYTES', 'COS_CLOCK_SKEW_MAX_SECONDS']) {
    const err = errorOf({ ...base, [name]: 'Infinity' })
    t.equal(err.variable, name, err.message)
    t.match(err.message, /\(got "Infinity"\)$/)
  }
})

t.test('settings that contradict each other stop at load with one line naming both variables', async t => {
  const cases: [Record<string, string>, string, RegExp][] = [
    // Node's HTTP server would throw a RangeError at start-up (headersTimeout must be <= requestTimeout).
    [{ ...base, COS_REQUEST_TIMEOUT_MS: '5000' }, 'COS_REQUEST_TIMEOUT_MS', /at least COS_HEADERS_TIMEOUT_MS \(10000\).*\(got 5000\)/],
    [{ ...base, COS_REQUEST_TIMEOUT_MS: '1000', COS_HEADERS_TIMEOUT_MS: '1001' }, 'COS_REQUEST_TIMEOUT_MS', /at least COS_HEADERS_TIMEOUT_MS \(1001\)/],
    // A method list for a route that does not exist would restrict nothing: those paths go to the catch-all.
    [{ ...base, COS_MANAGEMENT_ALLOWED_METHODS: 'GET,HEAD' }, 'COS_MANAGEMENT_ALLOWED_METHODS', /is set but COS_MANAGEMENT_API_URL is not/],
    [{ ...base, COS_OPTIMIZE_ALLOWED_METHODS: 'POST' }, 'COS_OPTIMIZE_ALLOWED_METHODS', /is set but COS_OPTIMIZE_API_URL is not/],
    [{ COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET, COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_API_ALLOWED_METHODS: 'GET' }, 'COS_API_ALLOWED_METHODS', /is set but COS_API_URL is not/],
    // Node arms the keep-alive timer 1000 ms past this value; beyond 2^31-1 ms the timer is cut short.
    [{ ...base, COS_KEEPALIVE_TIMEOUT_MS: '2147482648' }, 'COS_KEEPALIVE_TIMEOUT_MS', /1-2147482647/],
  ]
  for (const [env, variable, problem] of cases) {
    const err = errorOf(env)
    t.equal(err.variable, variable, err.message)
    t.ok(err.message.startsWith(variable + ' '), 'the line starts with the variable')
    t.match(err.message, problem)
    t.notOk(err.message.includes('\n'), 'one line')
  }
  // What Node accepts: equal timeouts, and a request timeout of 0 (none) with any headers timeout.
  t.equal(load({ ...base, COS_REQUEST_TIMEOUT_MS: '10000' }).client.requestTimeoutMs, 10000)
  t.equal(load({ ...base, COS_REQUEST_TIMEOUT_MS: '0', COS_HEADERS_TIMEOUT_MS: '600000' }).client.requestTimeoutMs, 0)
  t.equal(load({ ...base, COS_KEEPALIVE_TIMEOUT_MS: '2147482647' }).client.keepAliveTimeoutMs, 2147482647)
  t.same(load({ ...base, COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_MANAGEMENT_ALLOWED_METHODS: 'GET' }).routes[0]?.allowedMethods, ['GET'])
})

t.test('a secret that fails validation is not echoed', async t => {
  // Only a type failure could echo a value; the secret is free text, so force one on a
  // neighbour and make sure the message about credentials never carries the secret.
  const err = errorOf({ COS_API_URL: 'https://a.example.com', COS_ACCESS_KEY_SECRET: SECRET, COS_ACCESS_KEY_FILE: '/k', COS_ACCESS_KEY: 'ak' })
  t.notOk(err.message.includes(SECRET))
})

t.test('security settings: defaults and parsing', async t => {
  const d = load(base)
  t.same(d.allowFrom, ['127.0.0.0/8', '::1/128'])
  t.ok(d.allowFromIsDefault)
  t.equal(d.requireHeader, undefined)
  t.equal(d.maxBodyBytes, 0)
  t.same(d.client, { headersTimeoutMs: 10000, requestTimeoutMs: 300000, keepAliveTimeoutMs: 5000, maxConnections: 1024 })
  t.same(d.admin, { host: '127.0.0.1', port: 9090, maxConnections: 64, quitquitquit: true }, 'the admin listener holds 64 connections at most; /quitquitquit on')
  t.equal(load({ ...base, COS_ADMIN_MAX_CONNECTIONS: '8' }).admin.maxConnections, 8)
  t.equal(load({ ...base, COS_QUITQUITQUIT: 'false' }).admin.quitquitquit, false, 'COS_QUITQUITQUIT=false turns /quitquitquit off')
  const c = load({
    ...base,
    COS_ALLOW_FROM: '10.0.0.0/8, fd00::/8',
    COS_REQUIRE_HEADER: 'X-COS-Proxy: 1',
    COS_API_ALLOWED_METHODS: 'get, head,GET',
    COS_MAX_BODY_BYTES: '1048576',
  })
  t.same(c.allowFrom, ['10.0.0.0/8', 'fd00::/8'])
  t.notOk(c.allowFromIsDefault)
  t.same(c.requireHeader, { name: 'x-cos-proxy', value: '1' })
  t.same(c.routes[0]?.allowedMethods, ['GET', 'HEAD'])
  t.equal(c.maxBodyBytes, 1048576)
  t.same(load({ ...base, COS_REQUIRE_HEADER: 'X-Any' }).requireHeader, { name: 'x-any' })
})

t.test('browser settings: none listed by default; origins and hosts read as browsers send them', async t => {
  const d = load(base)
  t.same([d.allowedOrigins, d.allowedHosts], [[], []])
  const c = load({
    ...base,
    COS_ALLOWED_ORIGINS: 'HTTPS://App.Example:3000/, http://localhost:5173, https://x.example:443, chrome-extension://AbCdEf, , https://bücher.example',
    COS_ALLOWED_HOSTS: 'Proxy.Internal, 10.0.0.5 ,fd00::1,[FD00::2],localhost.',
  })
  t.same(c.allowedOrigins, ['https://app.example:3000', 'http://localhost:5173', 'https://x.example', 'chrome-extension://abcdef', 'https://xn--bcher-kva.example'],
    'lower case, no trailing slash, no default port, IDN as punycode')
  t.same(c.allowedHosts, ['proxy.internal', '10.0.0.5', '[fd00::1]', '[fd00::2]', 'localhost'])
})

t.test('empty values count as unset', async t => {
  const c = load({ ...base, COS_LISTEN_PORT: '', COS_MANAGEMENT_API_URL: '' })
  t.equal(c.listen.port, 8080)
  t.same(c.routes.map(r => r.name), ['api'])
})

t.test('commands that need less: credentials without upstream, or nothing at all', async t => {
  const c = load({ COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET }, { needs: 'credentials' })
  t.same(c.routes, [])
  t.throws(() => load({ COS_ACCESS_KEY: 'ak' }, { needs: 'credentials' }), /COS_ACCESS_KEY_SECRET_FILE/)
  const bare = load({ COS_ADMIN_PORT: '9191' }, { needs: 'nothing' })
  t.equal(bare.admin.port, 9191)
})

t.test('.env in the working directory is read and the real environment wins', async t => {
  const dir = mkdtempSync(join(tmpdir(), 'cos-env-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, '.env'), 'COS_API_URL=https://from-dotenv.example.com\nCOS_LISTEN_PORT=9999\nCOS_LOG_LEVEL=debug\nCOS_CONNECT_TIMEOUT_MS=\n')
  const cwd = process.cwd()
  process.chdir(dir)
  t.teardown(() => process.chdir(cwd))
  const c = loadConfig({ env: { COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET, COS_LISTEN_PORT: '7000' } })
  t.equal(c.routes[0]?.origin, 'https://from-dotenv.example.com')
  t.equal(c.listen.port, 7000, 'real env wins')
  t.equal(c.logLevel, 'debug')
  t.equal(c.connectTimeoutMs, 5000, 'an empty value in .env counts as unset, not 0')
})

t.test('the secret never prints: JSON, inspect, template strings, config output', async t => {
  const c = load(base)
  const all = [JSON.stringify(c), inspect(c, { depth: 10 }), String(c.credentials.secret.value), describeConfig(c)]
  for (const s of all) t.notOk(s.includes(SECRET), s.slice(0, 60))
  t.match(describeConfig(c), /"secret": \{\s*"value": "\[redacted\]"/)
  t.match(describeConfig(c), /"value": "ak"/, 'the access key may be shown')
})

t.test('credential files: trimmed, empty or missing is an error naming the variable, pair signs', async t => {
  const dir = mkdtempSync(join(tmpdir(), 'cos-cred-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'key'), '  AKIDFILE\n')
  writeFileSync(join(dir, 'secret'), SECRET + '\n')
  writeFileSync(join(dir, 'empty'), ' \n\t')
  writeFileSync(join(dir, 'badkey'), 'a/b\n')
  const env = { COS_API_URL: 'https://a.example.com', COS_ACCESS_KEY_FILE: join(dir, 'key'), COS_ACCESS_KEY_SECRET_FILE: join(dir, 'secret') }

  const good = await readPair(load(env).credentials, 'url')
  if (!good.ok) throw new Error('expected a pair')
  t.equal(good.accessKey, 'AKIDFILE')
  t.ok(verifyToken(good.minter.next().slice(7), { accessKey: 'AKIDFILE', key: SECRET }).ok, 'trimmed secret signs')

  const cases: [Record<string, string>, string, RegExp][] = [
    [{ COS_ACCESS_KEY_SECRET_FILE: join(dir, 'empty') }, 'COS_ACCESS_KEY_SECRET_FILE', /is empty/],
    [{ COS_ACCESS_KEY_FILE: join(dir, 'missing') }, 'COS_ACCESS_KEY_FILE', /cannot read .*ENOENT/],
    [{ COS_ACCESS_KEY_FILE: dir }, 'COS_ACCESS_KEY_FILE', /is a directory, not a regular file/],
    [{ COS_ACCESS_KEY_FILE: join(dir, 'badkey') }, 'COS_ACCESS_KEY_FILE', /must not contain/],
  ]
  for (const [override, variable, problem] of cases) {
    const r = await readPair(load({ ...env, ...override }).credentials, 'url')
    t.notOk(r.ok)
    if (!r.ok) {
      t.equal(r.variable, variable)
      t.match(r.problem, problem)
      t.notOk(r.problem.includes(SECRET))
    }
  }
  t.ok(!inspect(good, { depth: 10 }).includes(SECRET), 'inspecting a pair shows no secret')
})

t.test('egress proxy variables: the lowercase name wins, a bare host:port is http://, the port defaults to the scheme\'s', async t => {
  t.same(load(base).egress, { noProxy: [] }, 'none set: direct')
  const c = load({ ...base, HTTPS_PROXY: 'http://proxy.corp.example:3128', HTTP_PROXY: 'proxy.corp.example:8080', NO_PROXY: ' .svc,Internal.Example.com  10.0.0.0/8,,* ' })
  t.same(c.egress.https, { variable: 'HTTPS_PROXY', address: 'http://proxy.corp.example:3128', url: 'http://proxy.corp.example:3128' })
  t.same(c.egress.http, { variable: 'HTTP_PROXY', address: 'http://proxy.corp.example:8080', url: 'http://proxy.corp.example:8080' })
  t.same(c.egress.noProxy, ['.svc', 'internal.example.com', '10.0.0.0/8', '*'])
  const both = load({ ...base, https_proxy: 'http://lower:1', HTTPS_PROXY: 'http://upper:2', http_proxy: 'http://lower:3', HTTP_PROXY: 'http://upper:4', no_proxy: 'lower', NO_PROXY: 'upper' })
  t.same([both.egress.https?.address, both.egress.http?.address, both.egress.noProxy], ['http://lower:1', 'http://lower:3', ['lower']])
  const emptyLower = load({ ...base, https_proxy: '', HTTPS_PROXY: 'http://upper:2', no_proxy: '', NO_PROXY: 'upper' })
  t.same([emptyLower.egress.https?.variable, emptyLower.egress.noProxy], ['HTTPS_PROXY', ['upper']], 'an empty value counts as unset')
  t.equal(load({ ...base, HTTPS_PROXY: 'https://proxy.example' }).egress.https?.address, 'https://proxy.example:443')
  t.equal(load({ ...base, HTTPS_PROXY: 'HTTP://Proxy.Example/' }).egress.https?.address, 'http://proxy.example:80')
  t.equal(load({ ...base, HTTPS_PROXY: 'http://[fd00::1]:3128' }).egress.https?.address, 'http://[fd00::1]:3128')
})

t.test('credentials in a proxy URL become a redacted Basic Proxy-Authorization', async t => {
  const password = 'p:ss@w%rd-marker'
  const c = load({ ...base, https_proxy: `http://us%40er:${encodeURIComponent(password)}@proxy.example:3128` })
  const proxy = c.egress.https
  t.equal(proxy?.url, 'http://us%40er:[redacted]@proxy.example:3128')
  t.equal(proxy?.address, 'http://proxy.example:3128')
  t.equal(proxy?.authorization?.reveal(), `Basic ${Buffer.from(`us@er:${password}`).toString('base64')}`)
  for (const s of [JSON.stringify(c), inspect(c, { depth: 10 }), describeConfig(c)]) {
    t.notOk(s.includes(encodeURIComponent(password)) || s.includes(password) || s.includes(Buffer.from(`us@er:${password}`).toString('base64')), 'never printed')
  }
  t.match(describeConfig(c), /"authorization": "\[redacted\]"/)
  t.equal(load({ ...base, HTTPS_PROXY: 'http://user@proxy.example:3128' }).egress.https?.authorization?.reveal(), `Basic ${Buffer.from('user:').toString('base64')}`, 'a user without password, as curl sends it')
})

t.test('a malformed proxy URL exits naming the variable and never echoes its password', async t => {
  const cases: [Record<string, string>, string, RegExp][] = [
    [{ HTTPS_PROXY: 'socks5://user:pw-marker@proxy:1080' }, 'HTTPS_PROXY', /must be an http:\/\/ or https:\/\/ proxy URL \(got "socks5"\)/],
    [{ https_proxy: 'http://user:pw-marker@proxy:99999' }, 'https_proxy', /must be a proxy URL like .* \(got "<not shown/],
    [{ HTTP_PROXY: 'http://user:pw-marker@proxy:3128/path' }, 'HTTP_PROXY', /without path, query or fragment/],
    [{ http_proxy: 'http://user:pw-marker@proxy:3128?x=1' }, 'http_proxy', /without path, query or fragment/],
    [{ HTTPS_PROXY: 'http://user:pw-marker%zz@proxy:3128' }, 'HTTPS_PROXY', /malformed percent-encoding/],
    [{ HTTPS_PROXY: 'http://' }, 'HTTPS_PROXY', /must be a proxy URL/],
  ]
  for (const [env, variable, problem] of cases) {
    const err = errorOf({ ...base, ...env })
    t.equal(err.variable, variable, err.message)
    t.match(err.message, problem)
    t.notOk(err.message.includes('pw-marker'), 'no password')
  }
})

t.test('commands that do not serve ignore the proxy variables: a bad one cannot stop `token`', async t => {
  const c = load({ COS_ACCESS_KEY: 'ak', COS_ACCESS_KEY_SECRET: SECRET, HTTPS_PROXY: 'socks5://proxy:1080' }, { needs: 'credentials' })
  t.same(c.egress, { noProxy: [] })
})

t.test('nothing below src/cli.ts reads the environment: cli.ts hands process.env to loadConfig and loadInjectConfig', async t => {
  const src = fileURLToPath(new URL('../../src/', import.meta.url))
  const modules = readdirSync(src, { recursive: true, encoding: 'utf8' }).filter(f => f.endsWith('.ts') && f !== 'cli.ts')
  t.ok(modules.length > 50, `${modules.length} modules read`)
  for (const file of modules) {
    // Code only: a comment may say where the environment comes from.
    const code = readFileSync(join(src, file), 'utf8').split('\n').filter(line => !/^\s*(\/\/|\*|\/\*)/.test(line)).join('\n')
    t.notMatch(code, /\bprocess\.env\b|\bprocess\[['"]env['"]\]/, file)
  }
  t.match(readFileSync(join(src, 'cli.ts'), 'utf8'), /loadInjectConfig\(process\.env,/, 'cli.ts does')
})
