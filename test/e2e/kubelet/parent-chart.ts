// Sidecar mode on the node (issue 34, proofs 1-2): examples/sidecar-parent-chart installed by
// helm, the proxy as a native sidecar and as a plain container; the app's requests through
// 127.0.0.1:8080 answered by the mock API; the kubelet's probes on the admin port.
import { cpSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { ok, section } from '../harness/checks.js'
import { ROOT, seconds, sh, until } from '../harness/processes.js'
import { appRequests, type Context, runningPod, statusesOf } from './node.js'
import { probesOnAdminPort } from './injection.js'

export async function parentChart (x: Context, helmEnv: NodeJS.ProcessEnv, helmBin: string): Promise<void> {
  // A copy of the example beside the copy of the chart (file://../../helm/cos-auth-proxy), so
  // that `helm dependency build` writes nothing into the working tree.
  cpSync(join(ROOT, 'examples/sidecar-parent-chart'), join(x.work, 'examples/sidecar-parent-chart'), { recursive: true })
  const chart = join(x.work, 'examples/sidecar-parent-chart')
  const dep = sh(helmBin, ['dependency', 'build', chart], { env: helmEnv })
  if (dep.code !== 0) throw new Error(`helm dependency build: ${dep.stderr}`)
  const values = join(x.work, 'parent-values.yaml')
  writeFileSync(values, [
    `image: ${x.appImage}`,
    'replicaCount: 1',
    'cos-auth-proxy:',
    `  image: {repository: ${x.image.repository}, tag: ${x.image.tag}, pullPolicy: Never}`,
    `  upstream: {managementUrl: "${x.mockUrl}/management", optimizeUrl: "${x.mockUrl}/optimize"}`,
    '',
  ].join('\n'))

  for (const [release, native] of [['native', true], ['plain', false]] as const) {
    await section(`parent chart, sidecar.native=${native}`, async () => {
      const t = Date.now()
      const r = x.helm(['install', release, chart, '-f', values, '--set', `cos-auth-proxy.sidecar.native=${native}`, '--wait', '--timeout', '180s'])
      if (!ok(r.code === 0, `helm install ${release} (${seconds(t)})`, r.stderr.trim())) return
      const pod = await until(`a Running pod of ${release}`, 120_000, () => runningPod(x.cluster, 'default', `app.kubernetes.io/instance=${release}`), 1000)
      const name = pod.metadata.name
      const proxy = statusesOf(pod).find(s => s.name === 'cos-auth-proxy')
      const appStatus = statusesOf(pod).find(s => s.name === 'app')
      ok(native ? (pod.spec.initContainers ?? []).some(c => c.name === 'cos-auth-proxy' && c.restartPolicy === 'Always')
        : pod.spec.containers.some(c => c.name === 'cos-auth-proxy'),
      native ? 'the proxy is a native sidecar (initContainer, restartPolicy: Always)' : 'the proxy is a plain container beside the app')
      const requests = await until(`a 200 in the app's log of ${name}`, 90_000, async () => {
        const rs = await appRequests(x.cluster, 'default', name)
        return rs.some(q => q.status === '200') ? rs : undefined
      }, 1000)
      const first = requests[0]
      if (native) {
        const [ps, as] = [proxy?.state?.running?.startedAt ?? '', appStatus?.state?.running?.startedAt ?? '']
        ok(ps !== '' && as !== '' && Date.parse(ps) <= Date.parse(as),
          `the proxy started before the app: ${ps}, the app ${(Date.parse(as) - Date.parse(ps)) / 1000} s later (its startup probe passed in between)`)
        ok(first?.status === '200', `the app's first request through 127.0.0.1:8080 got ${first?.status ?? 'nothing'} (want 200)`)
      } else {
        // Plain container: both start together; the app retries until the proxy listens.
        const firstOk = requests.findIndex(q => q.status === '200')
        ok(firstOk >= 0, `the app got 200 through 127.0.0.1:8080 at request ${firstOk + 1} (before it: ${requests.slice(0, firstOk).map(q => q.status).join(', ') || 'nothing'})`)
      }
      ok(requests.slice(requests.findIndex(q => q.status === '200')).every(q => q.status === '200'),
        `every request after the first 200 got 200 (${requests.length} requests)`)
      const kubeletLog = readFileSync(join(x.runDir, 'kubelet.log'), 'utf8').split('\n')
      const podRef = `pod="default/${name}"`
      ok(kubeletLog.some(l => l.includes('probe="startup"') && l.includes('status="started"') && l.includes(podRef)),
        'the kubelet\'s startup probe on the admin port passed (kubelet log: probe="startup" status="started")')
      ok(kubeletLog.some(l => l.includes('probe="readiness"') && l.includes('status="ready"') && l.includes(podRef)),
        'the kubelet\'s readiness probe on the admin port passed (kubelet log: probe="readiness" status="ready")')
      if (native) await probesOnAdminPort(x.cluster, 'default', name)
      const podIP = pod.status.podIP ?? '?'
      const seen = await until(`the mock API's log of a request from ${podIP}`, 15_000, () => x.mockLog().includes(`"remoteAddress":"${podIP}"`) ? true : undefined, 1000).catch(() => false)
      ok(seen, `the mock API saw the requests come from the pod's address ${podIP}`)
      const del = x.helm(['uninstall', release, '--wait', '--timeout', '120s'])
      ok(del.code === 0, `helm uninstall ${release}`, del.stderr.trim())
    })
  }
}
