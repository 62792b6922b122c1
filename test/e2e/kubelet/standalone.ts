// The chart's standalone mode on the node (issue 34, proof 8): `helm install --set
// mode=deployment` as docs/kubernetes.md shows it, its Deployment's pods Ready, and a request to
// its Service's ClusterIP (routed by kube-proxy's iptables rules inside the namespace) answered
// 200 by the mock API through the proxy. The NetworkPolicy it renders is stored but not
// enforced: the node's CNI (the bridge plugin) enforces none.
import { ok, section } from '../harness/checks.js'
import { seconds, until } from '../harness/processes.js'
import { list, str } from '../harness/cluster.js'
import { type Context, curlStatus, imageValues } from './node.js'
import { APPS, readyOf } from './injection.js'

export async function standalone (x: Context): Promise<void> {
  await section('standalone: the Deployment answers through its Service', async () => {
    const t = Date.now()
    const r = x.helm(['install', 'cos-auth-proxy', x.chart, '--namespace', APPS, ...imageValues(x), '--set', 'mode=deployment',
      '--set', `upstream.managementUrl=${x.mockUrl}/management`, '--set', `upstream.optimizeUrl=${x.mockUrl}/optimize`,
      '--set', 'credentials.existingSecret=cos-credentials', '--set', 'proxy.allowFrom={10.88.0.0/16}', '--wait', '--timeout', '180s'])
    if (!ok(r.code === 0, `helm install cos-auth-proxy --set mode=deployment --wait (${seconds(t)})`, r.stderr.trim())) return
    const k = x.cluster
    const ready = readyOf(await k.find(`/apis/apps/v1/namespaces/${APPS}/deployments/cos-auth-proxy`).catch(() => undefined))
    ok(/^(\d+)\/\1$/.test(ready), `Deployment cos-auth-proxy: ${ready} replicas ready`)
    const ip = str(await k.find(`/api/v1/namespaces/${APPS}/services/cos-auth-proxy`).catch(() => undefined), 'spec', 'clusterIP') ?? ''
    const slices = await k.items(`/apis/discovery.k8s.io/v1/namespaces/${APPS}/endpointslices?labelSelector=${encodeURIComponent('kubernetes.io/service-name=cos-auth-proxy')}`).catch(() => [])
    const endpoints = slices.flatMap(s => list(s, 'endpoints').flatMap(e => str(e, 'addresses', 0) ?? []))
    ok(endpoints.length >= 1, `Service cos-auth-proxy at ${ip}:8080, endpoints ${endpoints.join(', ')}`)
    // kube-proxy programs a new Service's rules on its next sync (seconds on a busy machine): until then
    // the ClusterIP answers nothing. Wait for its first answer, then every request must get 200.
    const first = await until(`kube-proxy's rules for ${ip}`, 30_000, () => { const s = curlStatus(`http://${ip}:8080/management/v1/clusters`); return s === '000' ? undefined : s }, 1000).catch(() => '000')
    ok(first === '200', `the ClusterIP answers once kube-proxy has synced: ${first}`)
    const statuses = Array.from({ length: 6 }, () => curlStatus(`http://${ip}:8080/management/v1/clusters`))
    ok(statuses.every(s => s === '200'), `GET http://${ip}:8080/management/v1/clusters through kube-proxy: ${statuses.join(', ')}`)
    const seen = await until('the mock API\'s lines', 10_000, () => endpoints.some(e => x.mockLog().includes(`"remoteAddress":"${e}"`)) ? true : undefined, 1000).catch(() => false)
    ok(seen,
      'the mock API verified the tokens of requests from the Deployment\'s pods')
    const del = x.helm(['uninstall', 'cos-auth-proxy', '--namespace', APPS, '--wait', '--timeout', '120s'])
    ok(del.code === 0, 'helm uninstall cos-auth-proxy', del.stderr.trim())
  })
}
