// The guard's pure decisions; the attacks through a real proxy are in test/security/.
import t from 'tap'
import { allowList, hasRequiredHeader, peerAllowed, routeFor, targetProblem } from '../src/guard.js'
import { testConfig } from './helpers.js'

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

t.test('required header: exact value, or any non-empty value when no value is configured; never twice', async t => {
  t.ok(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, '1'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, '2'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, undefined))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy', value: '1' }, ['1', '1']))
  t.ok(hasRequiredHeader({ name: 'x-cos-proxy' }, 'anything'))
  t.notOk(hasRequiredHeader({ name: 'x-cos-proxy' }, ''))
})
