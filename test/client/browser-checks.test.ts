// Which Host names a listener beyond loopback accepts (issue 43, finding 5): the pure decision.
// Through the real proxy: test/security/browser.test.ts.
import t from 'tap'
import { browserPolicy, hostProblem, isPrivateName } from '../../src/client/browser-checks.js'
import { hostName } from '../../src/config/names.js'
import { testConfig } from '../support/helpers.js'

const policy = (env: Record<string, string> = {}): ReturnType<typeof browserPolicy> => browserPolicy(testConfig({ COS_API_URL: 'https://a.example.com', ...env }))

// Names clients use where the proxy listens beyond loopback: compose service names, the chart's
// NOTES (name.ns.svc), Kubernetes' FQDN, the kubelet test's ClusterIP, Docker's host name.
const PRIVATE = [
  'cos-auth-proxy:8080', 'cos-auth-proxy', 'COS-AUTH-PROXY', 'cos-auth-proxy.', 'cos-compose-1_cos-auth-proxy_1',
  'cos-auth-proxy.apps.svc:8080', 'cos-auth-proxy.apps.svc.cluster.local:8080', 'cos-auth-proxy.apps.svc.cluster.local.',
  'proxy.local', 'proxy.lan.home.arpa', 'proxy.internal', 'host.docker.internal', 'app.localhost:8080',
  '10.96.0.12:8080', '172.28.0.2', '0x0a.1', '[fd00::1]:8080', '[2001:db8::5]',
]
// What a rebound page sends: its own DNS name, public or merely dotted; and what hostName cannot read.
const PUBLIC = [
  'rebind.attacker.example:8080', 'rebind.attacker.example', 'attacker.example', '127.0.0.1.nip.io', '172-28-0-2.nip.io',
  'x.svc.attacker.example', 'x.local.attacker.example', 'svc.attacker.example', 'cos-auth-proxy.apps', 'localhost.example',
  'evil.example@127.0.0.1', '127.0.0.1/x', 'a b',
]

t.test('isPrivateName: IP literals, single labels and the private suffixes; never a dotted public name', async t => {
  for (const host of PRIVATE) t.ok(isPrivateName(hostName(host) ?? '.'), host)
  for (const host of PUBLIC.slice(0, -3)) t.notOk(isPrivateName(hostName(host) ?? '.'), host)
})

t.test('beyond loopback without COS_ALLOWED_HOSTS: private names and loopback pass; a dotted public name is refused, saying to list it', async t => {
  const wide = policy({ COS_LISTEN_HOST: '0.0.0.0' })
  for (const host of [...PRIVATE, 'localhost:8080', '127.0.0.1', '[::1]', undefined, '']) t.equal(hostProblem(wide, host), undefined, String(host))
  for (const host of PUBLIC) {
    const problem = hostProblem(wide, host)
    t.match(problem, /COS_ALLOWED_HOSTS/, host)
  }
  t.match(hostProblem(wide, 'rebind.attacker.example'), /list it in COS_ALLOWED_HOSTS/)
  t.equal(hostProblem(policy({ COS_LISTEN_HOST: '::' }), 'rebind.attacker.example'), hostProblem(wide, 'rebind.attacker.example'), 'the same on ::')
})

t.test('with COS_ALLOWED_HOSTS beyond loopback, or on a loopback listener: loopback and the list only', async t => {
  const listed = policy({ COS_LISTEN_HOST: '0.0.0.0', COS_ALLOWED_HOSTS: 'cos-auth-proxy,rebind.attacker.example' })
  for (const host of ['cos-auth-proxy:8080', 'rebind.attacker.example', 'localhost']) t.equal(hostProblem(listed, host), undefined, host)
  for (const host of ['other', '172.28.0.2', 'other.apps.svc', '[fd00::1]']) t.match(hostProblem(listed, host), /must name this machine/, host)
  const loopback = policy()
  for (const host of ['cos-auth-proxy', '10.0.0.5', 'proxy.internal', 'app.localhost']) t.match(hostProblem(loopback, host), /must name this machine/, host)
})
