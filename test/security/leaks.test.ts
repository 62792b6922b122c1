// What never leaves: one proxy logging at `trace`, with metrics wired, runs a
// representative request of every group of the security suite (successes,
// refusals, smuggling probes, a slow client, a forbidden source, upstream
// failures). Then the logs, every byte sent back to clients and the metrics
// are searched for the secret and for every token the upstreams received.
import { randomBytes } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { inspect } from 'node:util'
import t from 'tap'
import { ConfigError, LOG_FORMATS, describeConfig, loadConfig } from '../../src/config/config.js'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger, inLogFormat } from '../../src/observability/logger.js'
import { ProxyMetrics, classifyUpstreamError } from '../../src/observability/metrics.js'
import { PrettyLines } from '../../src/observability/pretty-log.js'
import { RequestLog } from '../../src/observability/request-log.js'
import { Secret } from '../../src/config/secret.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { ACCESS_KEY, LogCapture, REFUSING_PORT, SECRET, secretForms, testConfig, tokenForms } from '../support/helpers.js'
import { get, headerNames, rawRequest, startCountingUpstream, type RawResult } from '../support/raw.js'

t.test('at trace level, across every kind of request, no secret, token, signature or nonce leaves the proxy, in JSON or pretty logs', async t => {
  const recorder = await startCountingUpstream((_req, res) => {
    res.setHeader('content-type', 'application/json')
    res.end('{"ok":true}')
  })
  const hanging = await startCountingUpstream(() => { /* never answers: 504 */ })
  const env = {
    COS_MANAGEMENT_API_URL: recorder.url,
    COS_OPTIMIZE_API_URL: `${hanging.url}/v1`,
    COS_API_URL: `http://127.0.0.1:${REFUSING_PORT}`,
    COS_UPSTREAM_TIMEOUT_MS: '300',
    COS_ALLOW_FROM: '127.0.0.1/32',
    COS_REQUIRE_HEADER: 'X-COS-Proxy: 1',
    COS_MANAGEMENT_ALLOWED_METHODS: 'GET,HEAD,POST,PUT',
    COS_MAX_BODY_BYTES: '1000',
    COS_HEADERS_TIMEOUT_MS: '1000',
    COS_LOG_LEVEL: 'trace',
  }
  const config = testConfig(env)
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const credentials = new CredentialStore(pair.minter)
  const logs = new LogCapture()
  // COS_LOG_FORMAT=pretty formats the very lines the JSON form writes: both are kept and searched.
  const prettyLogs = new LogCapture()
  const pretty = new PrettyLines(prettyLogs)
  const bothForms = { write: (line: string) => { logs.write(line); pretty.write(line) } }
  const metrics = new ProxyMetrics()
  const observer = {
    requestStarted: () => { metrics.requestStarted() },
    requestFinished: (route: string, method: string, status: number, total: number, upstream: number | undefined) => { metrics.requestFinished(route, method, status, total, upstream) },
    upstreamError: (route: string, err: Error) => { metrics.upstreamError(route, classifyUpstreamError(err)) },
    retried: (route: string, reason: 'connect' | 'unauthorized') => { metrics.retried(route, reason) },
    tokenMinted: () => { metrics.tokenMinted() },
  }
  const app = await buildProxyServer({ config, credentials, logger: createLogger('trace', bothForms), observer, requestLog: new RequestLog(observer) })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as AddressInfo
  t.teardown(async () => { await app.close(); await recorder.close(); await hanging.close() })

  const R = 'X-COS-Proxy: 1\r\n'
  const clientAuth = 'Authorization: Bearer client-supplied-token-value\r\nProxy-Authorization: Basic Y2xpZW50OnBhc3N3b3Jk\r\nCookie: session=client-cookie-value\r\n'
  const results: RawResult[] = []
  const send = async (bytes: string | readonly string[], opts: Parameters<typeof rawRequest>[2] = {}): Promise<RawResult> => {
    const res = await rawRequest(port, typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes, { timeoutMs: 2500, ...opts })
    results.push(res)
    return res
  }

  // slow-loris: an idle connection, answered 408 by the header timeout (runs alongside the rest)
  const slow = send('GET /management/slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ', { timeoutMs: 4000 })

  // successes, with client credentials that must be dropped
  const body = randomBytes(600).toString('hex').slice(0, 600)
  for (const path of ['/management/v1/clusters?x=1', '/management/a%2Fb']) await send(get(path, R + clientAuth))
  await send(`POST /management/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}${clientAuth}Content-Type: text/plain\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`)
  await send(`PUT /management/chunked HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n`)
  await send(`HEAD /management/h HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Connection: close\r\n\r\n`, { head: true })
  // upstream failures: 504 and 502
  await send(get('/optimize/hangs', R + clientAuth))
  await send(get('/elsewhere', R + clientAuth))
  // refusals
  for (const bytes of [
    `GET http://other-host/x HTTP/1.1\r\nHost: other-host\r\n${R}${clientAuth}Connection: close\r\n\r\n`,
    'CONNECT other-host:443 HTTP/1.1\r\nHost: other-host:443\r\n\r\n',
    get('/management/../optimize/x', R),
    get('/management/%2e%2e/x', R),
    get('/management/%zz', R),
    get('/optimize%2Fx', R),
    get('/management/x', clientAuth),
    get('/management/x', 'X-COS-Proxy: 2\r\n'),
    `DELETE /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}${clientAuth}Connection: close\r\n\r\n`,
    `GET /management/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n`,
    `GET /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}X-Big: ${'b'.repeat(17 * 1024)}\r\n\r\n`,
    `POST /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Content-Length: 5000\r\n\r\n`,
    `POST /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Transfer-Encoding: chunked\r\n\r\n7d0\r\n${'a'.repeat(2000)}\r\n0\r\n\r\n`,
    `POST /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n`,
  ]) await send(bytes)
  // smuggling probes
  await send(`POST /management/x HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, { expect: 2 })
  await send([`GET /management/first HTTP/1.1\r\nHost: 127.0.0.1\r\n${R}\r\n`, 'GARBAGE\r\n\r\n'], { gapMs: 50, expect: 2 })
  // forbidden source
  await send(get('/management/x', R + clientAuth + 'X-Forwarded-For: 127.0.0.1\r\n'), { localAddress: '127.0.0.2' })
  // a few fuzz-like paths
  for (const path of ['/management/%E2%82%AC', '/management/;a=b', '/%6Danagement/x', '/management//x', '/management/a%20b?q=%00']) await send(get(path, R))
  await slow
  await new Promise(resolve => setTimeout(resolve, 100)) // log lines are written on close

  const text = logs.text
  const responses = Buffer.concat(results.map(r => r.bytes)).toString('latin1')
  const exposition = await metrics.text()
  const tokens = [...recorder.received, ...hanging.received].map(r => (r.headers.authorization ?? '').slice('Bearer '.length))
  t.ok(tokens.length >= 5, `${tokens.length} tokens reached the upstreams`)
  t.ok(logs.lines.length >= 20, `${logs.lines.length} log lines captured`)
  t.ok(logs.records.some(r => r.level === 'trace' || r.level === 'debug'), 'lines below info were captured')
  t.ok(logs.records.some(r => r.level === 'warn' || r.level === 'error'), 'upstream failures were logged')
  t.match(responses, /HTTP\/1\.1 408 /, 'the slow client got its 408')
  t.match(responses, /HTTP\/1\.1 504 /, 'the hanging upstream gave a 504')
  t.match(responses, /HTTP\/1\.1 502 /, 'the refused upstream gave a 502')

  t.equal(prettyLogs.lines.length, logs.lines.length, 'pretty: one line per event')
  const places: [string, string][] = [['logs', text], ['pretty logs', prettyLogs.text], ['responses to clients', responses], ['metrics', exposition]]
  for (const [where, haystack] of places) {
    for (const form of secretForms(SECRET)) t.notOk(haystack.includes(form), `${where}: the secret (${form}) is absent`)
    t.notOk(haystack.includes('client-supplied-token-value'), `${where}: the client's Authorization is absent`)
    t.notOk(haystack.includes('Y2xpZW50OnBhc3N3b3Jk'), `${where}: the client's Proxy-Authorization is absent`)
    const found = tokens.flatMap(tokenForms).filter(needle => haystack.includes(needle)).length
    t.equal(found, 0, `${where}: no token, signature or nonce of the ${tokens.length} the upstreams received`)
  }

  // Nothing that names the software: on the proxy's own errors and on passed-through responses.
  for (const res of results.flatMap(r => r.responses)) {
    t.notOk(headerNames(res).some(h => h === 'server' || h === 'x-powered-by'), `${res.statusLine}: no Server / X-Powered-By`)
  }
  t.notOk(/fastify|FST_ERR|node\.js|undici/i.test(responses), `response bytes do not name the stack (${/.{0,40}(fastify|FST_ERR|node\.js|undici).{0,40}/i.exec(responses)?.[0] ?? ''})`)
})

t.test('objects that hold the secret print nothing of it', async t => {
  const config = testConfig({ COS_API_URL: 'http://127.0.0.1:1' })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const store = new CredentialStore(pair.minter)
  const secret = new Secret(SECRET)
  const objects: [string, unknown][] = [
    ['Config', config], ['readPair result', pair], ['CredentialStore', store],
    ['HeaderMinter', pair.minter], ['KeyObject', pair.key], ['Secret', secret], ['credentials', config.credentials],
  ]
  for (const [name, o] of objects) {
    // JSON.stringify returns undefined for some values, whatever its typings say
    const json = JSON.stringify(o) as string | undefined
    const printed = [
      inspect(o, { depth: 20, showHidden: true, getters: true }),
      inspect(o, { depth: 20, showHidden: false }),
      json ?? '',
      String(o),
      Object.prototype.toString.call(o),
    ].join('\n')
    for (const form of secretForms(SECRET)) t.notOk(printed.includes(form), `${name}: ${form} not printed`)
  }
  t.notOk(describeConfig(config).includes(SECRET), 'describeConfig')
  t.equal(String(secret), '[redacted]')
  t.equal(secret.toString(), '[redacted]')
  // a logger handed the objects directly, in either COS_LOG_FORMAT
  for (const format of LOG_FORMATS) {
    const logs = new LogCapture()
    const logger = createLogger('trace', await inLogFormat(format, logs))
    logger.trace({ config, pair, store, secret, credentials: config.credentials }, 'objects')
    logger.info({ secret: SECRET, token: 'minted-token-value', authorization: 'Bearer auth-value-x', headers: { authorization: 'Bearer auth-value-y' } }, 'redaction paths')
    logger.flush()
    await new Promise(resolve => setTimeout(resolve, 50))
    t.equal(logs.lines.length, 2, `${format}: both lines written`)
    for (const form of secretForms(SECRET)) t.notOk(logs.text.includes(form), `${format} logger: ${form} absent`)
    for (const value of ['minted-token-value', 'auth-value-x', 'auth-value-y']) t.notOk(logs.text.includes(value), `${format} logger: ${value} redacted`)
  }
})

t.test('configuration and credential errors never quote the secret or a URL password', async t => {
  const errors: unknown[] = []
  const attempt = (env: Record<string, string>): void => {
    try {
      loadConfig({ env, dotenv: false })
    } catch (err) {
      errors.push(err)
    }
  }
  const base = { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET: SECRET }
  attempt({ ...base, COS_ACCESS_KEY_SECRET_FILE: '/nonexistent' })
  attempt({ ...base, COS_ALLOW_FROM: 'nope' })
  attempt({ ...base, COS_REQUIRE_HEADER: 'X: \x01' })
  attempt({ COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY_SECRET: SECRET })
  t.equal(errors.length, 4, 'every bad configuration threw')
  for (const err of errors) {
    t.ok(err instanceof ConfigError, `ConfigError: ${err instanceof Error ? err.message : String(err)}`)
    const printed = `${err instanceof Error ? err.message : ''}\n${inspect(err, { depth: 10, showHidden: true })}\n${JSON.stringify(err)}`
    for (const form of secretForms(SECRET)) t.notOk(printed.includes(form), `error does not quote ${form}`)
  }
  // config.ts never echoes user:password in an upstream URL ("userinfo is a
  // credential"), including when the URL does not parse at all.
  const password = 'UrL-pAsSwOrD-marker'
  for (const url of [`http://user:${password}@h/`, `http://user:${password}/x@h/`, `https://user:${password}@h:99999/`, `ftp://user:${password}@h/`, `http://user:${password}@h/?q=1`]) {
    let message = ''
    try {
      loadConfig({ env: { ...base, COS_MANAGEMENT_API_URL: url }, dotenv: false })
    } catch (err) {
      message = err instanceof Error ? `${err.message}\n${inspect(err)}` : String(err)
    }
    t.not(message, '', `${url.replace(password, '***')}: refused`)
    t.notOk(message.includes(password), `${url.replace(password, '***')}: the error does not quote the password (${message.split('\n')[0] ?? ''})`)
  }
  // a bad access key next to a good secret
  const config = testConfig({ COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY: 'bad/key' })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  t.notOk(pair.ok, 'a bad access key is refused')
  t.notOk(inspect(pair, { depth: 10 }).includes(SECRET), 'the refusal does not quote the secret')
})
