// The guard's pure decisions; the attacks through a real proxy are in test/security/.
import t from 'tap'
import { browserPolicy, fromWebPage, hostProblem, isLoopbackAddress, isLoopbackName, originProblem } from '../../src/client/browser-checks.js'
import { hostName } from '../../src/config/names.js'
import { allowList, hasRequiredHeader, peerAllowed, prefixLookalike, routeFor, targetProblem } from '../../src/client/guard.js'
import { testConfig } from '../support/helpers.js'

const { routes } = testConfig({ COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_API_URL: 'https://a.example.com' })

t.test('allow-list: CIDRs of both families, IPv4-mapped IPv6 counts as IPv4', async t => {
  const list = allowList(['127.0.0.0/8', '::1/128', '10.1.0.0/16'])
  t.ok(peerAllowed(list, '127.0.0.1'))
  t.ok(peerAllowed(list, '127.255.0.9'))
  t.ok(peerAllowed(list, '::1'))
  t.ok(peerAllowed(list, '::ffff:127.0.0.1'))
  t.ok(peerAllowed(list, '10.1.200.3'))
  t.ok(peerAllowed(list, '::ffff:10.1.0.1'))
  t.notOk(peerAllowed(list, '10.2.0.1'))
  t.notOk(peerAllowed(list, '::ffff:10.2.0.1'))
  t.notOk(peerAllowed(list, '::2'))
  t.notOk(peerAllowed(list, '192.168.1.1'))
  t.notOk(peerAllowed(list, undefined), 'no address, no entry')
  t.notOk(peerAllowed(allowList(['127.0.0.1/32']), '127.0.0.2'))
})

t.test('routeFor matches on a segment boundary like the router', async t => {
  t.equal(routeFor(routes, '/optimize')?.name, 'optimize')
  t.equal(routeFor(routes, '/optimize/x')?.name, 'optimize')
  t.equal(routeFor(routes, '/optimizer')?.name, 'api')
  t.equal(routeFor(routes, '/management/v1')?.name, 'management')
  t.equal(routeFor(routes.filter(r => r.name !== 'api'), '/other'), undefined)
})

t.test('targetProblem accepts ordinary paths and refuses every escape', async t => {
  const fine = ['/', '/optimize/workloads?x=1', '/v1.2/a.b/.well-known/x', '/a/...', '/optimize/a%2Fb', '/echo/%E2%82%AC?q=%2e%2e', '/a%20b', '/a?x=../../etc', '/management/a%2fb/c']
  for (const url of fine) t.equal(targetProblem(url, routes), undefined, url)
  const refused: [string, RegExp][] = [
    ['http://evil.example/x', /origin-form/],
    ['*', /origin-form/],
    ['evil.example:443', /origin-form/],
    ['/a/../b', /dot-segment/],
    ['/a/./b', /dot-segment/],
    ['/..', /dot-segment/],
    ['/a/%2e%2e/b', /dot-segment/],
    ['/a/%2E%2E/b', /dot-segment/],
    ['/a/%2E./b', /dot-segment/],
    ['/a/.%2e/b', /dot-segment/],
    ['/a/..%2fb', /dot-segment/],
    ['/a/%2f../b', /dot-segment/],
    ['/a/..%2F', /dot-segment/],
    ['/a\\b', /backslash/],
    ['/a/%5cb', /backslash/],
    ['/a/%5C..', /backslash/],
    ['/a%00b', /NUL/],
    ['/a/%252e%252e/b', /double-encoded/],
    ['/a/%252f', /double-encoded/],
    ['/a/%zz', /malformed/],
    ['/a/%e2%82', /malformed/],
    ['/a#frag', /fragment/],
    ['/optimize%2Fx', /change the route/],
    ['/optimize%2fworkloads', /change the route/],
  ]
  for (const [url, problem] of refused) t.match(targetProblem(url, routes), problem, url)
})

t.test('dot-segments are refused also as servers that drop ";params" or trailing spaces read them', async t => {
  for (const url of ['/a/..;/management/x', '/a/..;x/b', '/a/.;/b', '/a/..%3B/b', '/a/%2e%2e;/b', '/a/..%20/b', '/a/..%09/b', '/a/.;b.c']) t.match(targetProblem(url, routes), /dot-segment/, url)
  for (const url of ['/a/...', '/a/.well-known/x', '/a/..b', '/a/.b;c']) t.equal(targetProblem(url, routes), undefined, url)
})

t.test('prefixLookalike: a catch-all path that imitates a route prefix is named; paths merely sharing letters are not', async t => {
  const multi = testConfig({ COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_OPTIMIZE_API_URL: 'https://o.example.com', COS_OPTIMIZE_PATH_PREFIX: '/opt/v1', COS_API_URL: 'https://a.example.com' }).routes
  const lookalikes: [string, string][] = [
    ['/management;x/clusters', '/management'],
    ['/management%3Bx/clusters', '/management'],
    ['/management%3b', '/management'],
    ['/MANAGEMENT/clusters', '/management'],
    ['/Management', '/management'],
    ['/Management?x=1', '/management'],
    ['/%4Danagement/clusters', '/management'],
    ['/%4danagement/clusters', '/management'],
    ['/management./clusters', '/management'],
    ['/management%2e/clusters', '/management'],
    ['/management%20/clusters', '/management'],
    ['/management%09/clusters', '/management'],
    ['/management.%20./clusters', '/management'],
    ['/%20management/clusters', '/management'],
    ['/management%C2%A0/clusters', '/management'],
    ['//management/clusters', '/management'],
    ['/;x/management/clusters', '/management'],
    ['/%EF%BD%8Danagement/clusters', '/management'], // fullwidth ｍ
    ['/%254Danagement/clusters', '/management'], // decoded twice by a lenient upstream
    ['/opt/V1/x', '/opt/v1'],
    ['/OPT/v1', '/opt/v1'],
    ['/opt;a/v1/x', '/opt/v1'],
    ['/opt//v1/x', '/opt/v1'],
    ['/opt/v1;x/y', '/opt/v1'],
    ['/opt/v1./y', '/opt/v1'],
    ['/opt%2FV1/y', '/opt/v1'],
  ]
  for (const [url, prefix] of lookalikes) t.equal(prefixLookalike(url, multi)?.prefix, prefix, `${url} imitates ${prefix}`)
  // Paths the router sends to the catch-all that only share letters (it sends /management/… and /%6Danagement/… to their route).
  const fine = ['/managementx/clusters', '/manage/x', '/m', '/opt/v2/x', '/opt', '/opt/x', '/OPT', '/v1/management/x', '/optimize/x', '/metrics', '/', '/x;management', '/Managementx', '/mgmt/v1']
  for (const url of fine) t.equal(prefixLookalike(url, multi), undefined, url)
  t.equal(prefixLookalike('/MANAGEMENT/x', multi.filter(r => r.prefix === '')), undefined, 'no prefixed route, nothing to imitate')
  t.equal(prefixLookalike('/opt%C4%B1mize/x', routes)?.prefix, '/optimize', 'a dotless ı folds to i through upper case (Java equalsIgnoreCase)')
  t.equal(prefixLookalike('/%C5%BFomething/x', testConfig({ COS_MANAGEMENT_API_URL: 'https://m.example.com', COS_MANAGEMENT_PATH_PREFIX: '/something', COS_API_URL: 'https://a.example.com' }).routes)?.prefix, '/something', 'the long ſ is s')
})

t.test('required header: exact value, or any non-empty value when no value is configured; never twice', async t => {
  t.ok(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, '1'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, '2'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, undefined))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, ['1', '1']))
  t.ok(hasRequiredHeader({ name: 'x-cos-proxy' }, 'anything'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy' }, ''))
})

t.test('hostName reads a Host value as a browser reads a URL host; anything but host[:port] is undefined', async t => {
  const read: [string, string][] = [
    ['127.0.0.1:8080', '127.0.0.1'],
    ['LOCALHOST', 'localhost'],
    ['localhost.:8080', 'localhost'],
    ['127.1', '127.0.0.1'],
    ['0x7f.0.0.1:1', '127.0.0.1'],
    ['[::1]:8080', '[::1]'],
    ['[0:0:0:0:0:0:0:1]', '[::1]'],
    ['[::FFFF:127.0.0.1]', '[::ffff:7f00:1]'],
    ['Rebind.Attacker.Example:8080', 'rebind.attacker.example'],
    ['proxy.internal:', 'proxy.internal'],
  ]
  for (const [value, name] of read) t.equal(hostName(value), name, value)
  for (const value of ['evil.example@127.0.0.1', 'user:pw@localhost', '127.0.0.1/x', 'localhost 127.0.0.1', 'local%68ost', '127.0.0.1:99999', '::1', '[::1', 'a:b:c', '']) {
    t.equal(hostName(value), undefined, JSON.stringify(value))
  }
})

t.test('loopback names: localhost, 127.0.0.0/8, ::1 and 127/8 mapped into IPv6; nothing else', async t => {
  for (const name of ['localhost', '127.0.0.1', '127.255.255.254', '[::1]', '[::ffff:7f00:1]']) t.ok(isLoopbackName(name), name)
  for (const name of ['localhost.example', 'app.localhost', '128.0.0.1', '10.0.0.1', '[::2]', '[::ffff:a00:1]', '127.0.0.1.example', '']) t.notOk(isLoopbackName(name), name)
  for (const address of ['127.0.0.1', '127.0.0.2', '::1', '0:0:0:0:0:0:0:1', 'localhost']) t.ok(isLoopbackAddress(address), address)
  for (const address of ['0.0.0.0', '::', '10.0.0.5', 'proxy.internal']) t.notOk(isLoopbackAddress(address), address)
})

const policy = (env: Record<string, string> = {}): ReturnType<typeof browserPolicy> => browserPolicy(testConfig({ COS_API_URL: 'https://a.example.com', ...env }))

t.test('originProblem: an Origin passes only when listed; Sec-Fetch-Site passes only as none or same-origin', async t => {
  const listed = policy({ COS_ALLOWED_ORIGINS: 'https://App.Example:3000' })
  t.equal(originProblem(listed, undefined, undefined), undefined, 'no Origin, no Sec-Fetch-Site: not a browser')
  t.equal(originProblem(listed, undefined, 'none'), undefined, 'typed in the address bar')
  t.equal(originProblem(listed, undefined, 'same-origin'), undefined)
  t.equal(originProblem(listed, 'https://app.example:3000', 'cross-site'), undefined, 'a listed origin, cross-site as it must be')
  t.equal(originProblem(listed, 'HTTPS://APP.EXAMPLE:3000', undefined), undefined, 'compared case-insensitively')
  const refused: [string | undefined, string | undefined][] = [
    ['https://evil.example', undefined],
    ['https://evil.example', 'cross-site'],
    ['https://app.example:3001', 'cross-site'],
    ['http://app.example:3000', undefined],
    ['https://app.example:3000.evil.example', undefined],
    ['null', undefined],
    ['null', 'cross-site'],
    ['', undefined],
    ['http://127.0.0.1:8080', 'same-origin'],
    [undefined, 'cross-site'],
    [undefined, 'same-site'],
    [undefined, 'unheard-of'],
  ]
  for (const [origin, site] of refused) t.type(originProblem(listed, origin, site), 'string', `Origin ${String(origin)}, Sec-Fetch-Site ${String(site)}`)
  t.type(originProblem(policy(), 'https://app.example:3000', undefined), 'string', 'nothing is listed by default')
})

t.test('hostProblem: on a loopback listener only loopback names and listed ones pass, with any port; no Host passes', async t => {
  const loopback = policy()
  for (const host of [undefined, '', '127.0.0.1:8080', 'localhost:1', 'localhost.', 'LocalHost', '[::1]:8080', '127.0.0.2', '127.1:8080']) {
    t.equal(hostProblem(loopback, host), undefined, String(host))
  }
  for (const host of ['rebind.attacker.example:8080', 'a', 'app.localhost', '10.0.0.5', 'evil.example@127.0.0.1', '127.0.0.1.nip.io', '[::2]']) {
    t.type(hostProblem(loopback, host), 'string', host)
  }
  const listed = policy({ COS_ALLOWED_HOSTS: 'proxy.internal,fd00::1' })
  for (const host of ['proxy.internal', 'PROXY.internal:8080', 'proxy.internal.', '[fd00::1]:80', 'localhost']) t.equal(hostProblem(listed, host), undefined, host)
  t.type(hostProblem(listed, 'other.internal'), 'string')
  const wide = policy({ COS_LISTEN_HOST: '0.0.0.0' })
  t.ok(wide.privateNames, 'beyond loopback, names no public DNS serves pass too (test/client/browser-checks.test.ts)…')
  t.equal(hostProblem(wide, 'cos-auth-proxy.team.svc:8080'), undefined)
  const wideListed = policy({ COS_LISTEN_HOST: '0.0.0.0', COS_ALLOWED_HOSTS: 'cos-auth-proxy.team.svc' })
  t.notOk(wideListed.privateNames, '…unless a list is given')
  t.equal(hostProblem(wideListed, 'cos-auth-proxy.team.svc:8080'), undefined)
  t.type(hostProblem(wideListed, 'other.team.svc'), 'string')
})

t.test('fromWebPage (admin listener): any Origin, or Sec-Fetch-Site other than none', async t => {
  t.notOk(fromWebPage(undefined, undefined))
  t.notOk(fromWebPage(undefined, 'none'))
  t.ok(fromWebPage('null', undefined))
  t.ok(fromWebPage('http://127.0.0.1:9090', 'same-origin'))
  t.ok(fromWebPage(undefined, 'same-origin'))
  t.ok(fromWebPage(undefined, 'cross-site'))
  t.ok(fromWebPage(undefined, ['none', 'none']))
})
