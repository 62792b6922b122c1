// Pods the injector made, run by the kubelet (issue 34, proofs 3-8): the chart's injector
// installed by helm (its Deployment, its Service, its MutatingWebhookConfiguration as rendered,
// called by the API server through the Service and kube-proxy), then annotated workloads in a
// labelled namespace: a Deployment whose app reaches the API through COS_PROXY_URL; a Job that
// completes although its sidecar runs; 256 connections inside the sidecar's memory limit; a pod
// deleted with a request in flight; the Secret rotated under a running proxy, then replaced by
// a pair the upstream refuses. The app is test/e2e/kubelet/app.mjs; the upstream
// test/e2e/kubelet/upstream.ts.
import { join } from 'node:path'
import { accessKeyHint } from '../../../src/credentials/credentials.js'
import { ok, section } from '../harness/checks.js'
import { type Cluster, get } from '../harness/cluster.js'
import { seconds, sleep, until } from '../harness/processes.js'
import { apply, appRequests, cgroupMemory, containerCgroup, containersOf, type Context, curlBody, failure, imageValues, jsonLines, jsonLog, logOf, metric, mib, type Pair, type Pod, pods, probesPassed, requestLines, runningPod, secretOf, statusesOf } from './node.js'

export const APPS = 'apps'
const SYSTEM = 'cos-system'
const RELEASE = 'cos'
const INJECTOR = `${RELEASE}-cos-auth-proxy-injector`
const PROXY = 'cos-auth-proxy'
const ADMIN_PORT = 9090

/** An annotated workload of the app image; env configures test/e2e/kubelet/app.mjs. */
function workload (x: Context, kind: 'Deployment' | 'Job', name: string, env: Record<string, string>): unknown {
  const template = {
    metadata: { labels: { app: name }, annotations: { 'cos-auth-proxy.io/inject': 'true' } },
    spec: {
      ...(kind === 'Job' ? { restartPolicy: 'Never' } : {}),
      containers: [{ name: 'app', image: x.appImage, imagePullPolicy: 'Never', env: Object.entries(env).map(([k, v]) => ({ name: k, value: v })) }],
    },
  }
  return kind === 'Deployment'
    ? { apiVersion: 'apps/v1', kind, metadata: { name }, spec: { replicas: 1, selector: { matchLabels: { app: name } }, template } }
    : { apiVersion: 'batch/v1', kind, metadata: { name }, spec: { backoffLimit: 0, template } }
}

/** The Secret the injected sidecars mount (the injector's defaultSecret), holding pair p. */
async function putSecret (k: Cluster, p: Pair, verb: 'create' | 'replace'): Promise<boolean> {
  const secret = secretOf('cos-credentials', { 'access-key': join(p.dir, 'access-key'), 'access-key-secret': join(p.dir, 'access-key-secret') })
  const path = `/api/v1/namespaces/${APPS}/secrets`
  return await failure(verb === 'create' ? k.create(path, secret) : k.replace(`${path}/cos-credentials`, secret)) === ''
}

const proxyMetrics = (pod: Pod): string => curlBody(`http://${pod.status.podIP ?? '?'}:${ADMIN_PORT}/metrics`)
const bytes = (quantity: string): number => {
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(quantity)
  return m === null ? NaN : Number(m[1]) * ({ Ki: 1 << 10, Mi: 1 << 20, Gi: 1 << 30 }[m[2] ?? ''] ?? 1)
}

async function waitForPod (k: Cluster, selector: string, seconds_: number): Promise<Pod> {
  return await until(`a Running pod ${selector} in ${APPS}`, seconds_ * 1000, () => runningPod(k, APPS, selector), 1000)
}

/** The kubelet's startup, readiness and liveness probes of the sidecar all passed at least once. */
export async function probesOnAdminPort (k: Cluster, ns: string, pod: string): Promise<void> {
  const counts = await until(`the kubelet's liveness probe of ${pod}`, 60_000, async () => {
    const c = await probesPassed(k, ns, pod, PROXY)
    return c.Startup > 0 && c.Readiness > 0 && c.Liveness > 0 ? c : undefined
  }, 1000).catch(() => probesPassed(k, ns, pod, PROXY))
  ok(counts.Startup > 0 && counts.Readiness > 0 && counts.Liveness > 0,
    `the kubelet's probes on the admin port passed: startup ${counts.Startup}, readiness ${counts.Readiness}, liveness ${counts.Liveness} (its prober_probe_total{result="successful"})`)
}

/** A number or string field as `-o jsonpath` prints it ('' when absent). */
const field = (v: unknown, ...path: string[]): string => { const f = get(v, ...path); return typeof f === 'number' || typeof f === 'string' ? String(f) : '' }
/** "readyReplicas/replicas" of a Deployment, as `-o jsonpath={.status.readyReplicas}/{.spec.replicas}` prints it. */
export const readyOf = (d: unknown): string => `${field(d, 'status', 'readyReplicas')}/${field(d, 'spec', 'replicas')}`

export async function injectorAndLooper (x: Context): Promise<void> {
  const k = x.cluster
  await section('injector installed by helm, behind its Service', async () => {
    const t = Date.now()
    const r = x.helm(['install', RELEASE, x.chart, '--namespace', SYSTEM, '--create-namespace', ...imageValues(x),
      '--set', `upstream.managementUrl=${x.upstream.url}/management`, '--set', `upstream.optimizeUrl=${x.upstream.url}/optimize`,
      '--set', 'injector.enabled=true', '--set', 'injector.defaultSecret=cos-credentials', '--wait', '--timeout', '180s'])
    if (!ok(r.code === 0, `helm install ${RELEASE} --set injector.enabled=true --wait (${seconds(t)})`, r.stderr.trim())) return
    const ready = readyOf(await k.find(`/apis/apps/v1/namespaces/${SYSTEM}/deployments/${INJECTOR}`).catch(() => undefined))
    ok(ready === '2/2', `the injector's Deployment: ${ready} replicas ready (its probes passing)`)
    const mwc = (await k.find(`/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${INJECTOR}`).catch(() => undefined) ?? { webhooks: [] }) as unknown as
      { webhooks: Array<{ clientConfig: { url?: string, service?: { name: string, namespace: string, port?: number }, caBundle?: string } }> }
    const cc = mwc.webhooks[0]?.clientConfig
    ok(cc?.service?.name === INJECTOR && cc.service.namespace === SYSTEM && cc.url === undefined && (cc.caBundle ?? '').length > 0,
      `the MutatingWebhookConfiguration as the chart rendered it: clientConfig.service ${cc?.service?.namespace ?? '?'}/${cc?.service?.name ?? '?'}:${cc?.service?.port ?? 443}, the chart's CA`)
    // (the checks keep the names of the kubectl commands they were)
    for (const [args, done] of [
      [['create', 'namespace', APPS], () => k.create('/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: APPS } })],
      [['label', 'namespace', APPS, 'cos-auth-proxy.io/injection=enabled'], () => k.patch(`/api/v1/namespaces/${APPS}`, { metadata: { labels: { 'cos-auth-proxy.io/injection': 'enabled' } } })],
    ] as const) {
      const why = await failure(done())
      ok(why === '', `kubectl ${args.join(' ')}`, why)
    }
    ok(await putSecret(k, x.pairs.a, 'create'), `Secret cos-credentials in ${APPS} (pair a)`)
  })

  await section('injection: an annotated Deployment, COS_PROXY_URL', async () => {
    const t = Date.now()
    const applied = await apply(k, APPS, workload(x, 'Deployment', 'looper', { APP_INTERVAL_MS: '500' }))
    ok(applied === '', 'Deployment looper (annotated) applied', applied)
    const pod = await waitForPod(k, 'app=looper', 150)
    const name = pod.metadata.name
    const sidecar = (pod.spec.initContainers ?? []).find(c => c.name === PROXY)
    ok(sidecar?.restartPolicy === 'Always', `${name}: injected by the API server's call through the Service: a native sidecar (${seconds(t)} from apply to Running)`)
    ok(pod.metadata.annotations?.['cos-auth-proxy.io/injected-version'] !== undefined, `${name}: annotated cos-auth-proxy.io/injected-version=${pod.metadata.annotations?.['cos-auth-proxy.io/injected-version'] ?? '?'}`)
    const env = pod.spec.containers.find(c => c.name === 'app')?.env?.find(e => e.name === 'COS_PROXY_URL')?.value
    ok(env === 'http://127.0.0.1:8080', `the app container has COS_PROXY_URL=${env ?? '(none)'}`)
    // Issue 37: the pod's ServiceAccount token in the app, not in the proxy (an empty directory over its path;
    // with a sizeLimit of 1Ki the kubelet evicted the pod: the directory's own block counts).
    const tokenMount = (c: { volumeMounts?: Array<{ name: string, mountPath: string }> } | undefined): string => c?.volumeMounts?.find(m => m.mountPath === '/var/run/secrets/kubernetes.io/serviceaccount')?.name ?? '(none)'
    const appToken = tokenMount(pod.spec.containers.find(c => c.name === 'app'))
    ok(appToken.startsWith('kube-api-access-') && tokenMount(sidecar) === 'cos-auth-proxy-no-api-token',
      `the ServiceAccount token is mounted in the app (${appToken}), not in the proxy (${tokenMount(sidecar)})`)
    const requests = await until(`a 200 in ${name}'s app log`, 60_000, async () => {
      const rs = await appRequests(k, APPS, name)
      return rs.some(q => q.status === '200') ? rs : undefined
    }, 1000)
    const appLog = await logOf(k, APPS, name, 'app')
    ok(appLog.includes('from COS_PROXY_URL') && requests[0]?.status === '200',
      `the app's first request, to $COS_PROXY_URL/management/v1/clusters, got ${requests[0]?.status ?? 'nothing'}`)
    const verified = await until('the upstream\'s line', 10_000, () =>
      x.upstream.requests().some(q => q.remote === pod.status.podIP && q.key === x.pairs.a.key && q.status === 200) ? true : undefined, 1000).catch(() => false)
    ok(verified, `the upstream verified its token (pair a) on a request from the pod's address ${pod.status.podIP ?? '?'}`)
    let injected = 0
    for (const p of await pods(k, SYSTEM, 'app.kubernetes.io/component=injector')) {
      injected += metric(curlBody(`http://${p.status.podIP ?? '?'}:${ADMIN_PORT}/metrics`), 'cos_auth_proxy_inject_injected_total')
    }
    ok(injected >= 1, `the injector's replicas count ${injected} pod(s) injected (cos_auth_proxy_inject_injected_total)`)
    await probesOnAdminPort(k, APPS, name)
  })
}

export async function jobCompletes (x: Context): Promise<void> {
  const k = x.cluster
  await section('a Job with a native sidecar completes', async () => {
    const t = Date.now()
    const applied = await apply(k, APPS, workload(x, 'Job', 'once', { APP_MODE: 'once' }))
    ok(applied === '', 'Job once (annotated) applied', applied)
    const done = await until('Job once succeeded or failed', 180_000, async () => {
      const job = await k.find(`/apis/batch/v1/namespaces/${APPS}/jobs/once`).catch(() => undefined)
      const s = `${field(job, 'status', 'succeeded')}/${field(job, 'status', 'failed')}`
      return s === '1/' || s.endsWith('/1') ? s : undefined
    }, 1000)
    ok(done === '1/', `Job once: succeeded (${seconds(t)} from apply), not left running by its sidecar`, done)
    const pod = (await pods(k, APPS, 'job-name=once'))[0]
    ok(pod?.status.phase === 'Succeeded', `its pod ended ${pod?.status.phase ?? '?'}`)
    const exits = pod === undefined ? [] : statusesOf(pod).map(s => `${s.name} ${s.state?.terminated?.exitCode ?? '?'}`)
    ok(exits.length === 2 && exits.every(e => e.endsWith(' 0')), `app and sidecar both exited 0 (${exits.join(', ')})`)
    await k.remove(`/apis/batch/v1/namespaces/${APPS}/jobs/once`, { propagationPolicy: 'Foreground' }).catch(() => {})
  })
}

export async function memoryLimit (x: Context): Promise<void> {
  const k = x.cluster
  await section('the memory limit, in the container\'s cgroup, under 256 connections', async () => {
    const applied = await apply(k, APPS, workload(x, 'Deployment', 'loader', { APP_MODE: 'load', APP_CONNECTIONS: '256', APP_DURATION_S: '20', APP_DELAY_S: '10' }))
    ok(applied === '', 'Deployment loader (256 connections for 20 s, after 10 s idle) applied', applied)
    const pod = await waitForPod(k, 'app=loader', 150)
    const name = pod.metadata.name
    const cg = containerCgroup(pod, PROXY)
    if (cg === undefined) { ok(false, `${name}: the sidecar's memory cgroup, under /sys/fs/cgroup/memory/kubepods`); return }
    const want = bytes(containersOf(pod).find(c => c.name === PROXY)?.resources?.limits?.memory ?? '')
    await sleep(5000)
    const idle = cgroupMemory(cg.container)
    ok(idle.limit === want, `memory.limit_in_bytes ${mib(idle.limit)} is the chart's limit (${mib(want)})`)
    console.log(`  # idle, 5 s after start: working set ${mib(idle.workingSet)}, usage ${mib(idle.usage)}`)
    const done = await until(`${name}: load done`, 120_000, async () => /load: done (\{.*\})/.exec(await logOf(k, APPS, name, 'app'))?.[1], 1000)
    const load = JSON.parse(done) as { connections: number, requests: number, ok: number, failed: number, sockets: number }
    const after = cgroupMemory(cg.container)
    const podMax = cgroupMemory(cg.pod).maxUsage
    const restarts = statusesOf(await runningPod(k, APPS, 'app=loader') ?? pod).find(s => s.name === PROXY)?.restartCount ?? -1
    ok(load.requests > 0 && load.failed === 0, `256 connections: ${load.requests} requests, ${load.failed} failed (${load.sockets} connections open at the end)`)
    ok(after.maxUsage < after.limit && after.oomKills === 0 && restarts === 0,
      `the sidecar stayed under its limit: memory.max_usage_in_bytes ${mib(after.maxUsage)} of ${mib(after.limit)}, ${after.oomKills} OOM kills, ${restarts} restarts`)
    console.log(`  # after the load: working set ${mib(after.workingSet)} (usage ${mib(after.usage)} - inactive file), the pod's max usage ${mib(podMax)}`)
    await k.remove(`/apis/apps/v1/namespaces/${APPS}/deployments/loader`).catch(() => {})
  })
}

export async function termination (x: Context): Promise<void> {
  const k = x.cluster
  await section('termination: kubectl delete pod with a request in flight', async () => {
    const applied = await apply(k, APPS, workload(x, 'Deployment', 'drainer', { APP_PATH: '/v1/slow', APP_INTERVAL_MS: '100' }))
    ok(applied === '', 'Deployment drainer applied (its app keeps a 4 s request in flight)', applied)
    const pod = await waitForPod(k, 'app=drainer', 150)
    const name = pod.metadata.name
    const podPath = `/api/v1/namespaces/${APPS}/pods/${name}`
    await until(`a 200 in ${name}'s app log`, 60_000, async () => (await appRequests(k, APPS, name)).some(q => q.status === '200') ? true : undefined, 1000)
    // A finalizer keeps the Pod object, with its containers' final states, after they stop; their
    // logs are followed from now on, since the kubelet removes a deleted pod's containers.
    const hold = await failure(k.patch(podPath, { metadata: { finalizers: ['cos-auth-proxy.io/test-hold'] } }))
    ok(hold === '', `${name}: held by a finalizer for the checks`, hold)
    const logs = { app: k.followLog(APPS, name, 'app'), proxy: k.followLog(APPS, name, PROXY) }
    await sleep(1000)
    const deletedAt = Date.now()
    const del = await failure(k.remove(podPath))
    ok(del === '', `kubectl delete pod ${name}`, del)
    const grace = pod.spec.terminationGracePeriodSeconds ?? 30
    try {
      const ended = await until(`${name}: both containers terminated`, (grace + 30) * 1000, async () => {
        const p = (await pods(k, APPS, 'app=drainer')).find(q => q.metadata.name === name)
        return p !== undefined && statusesOf(p).every(s => s.state?.terminated !== undefined) ? p : undefined
      }, 1000)
      await Promise.race([Promise.all([logs.app.ended, logs.proxy.ended]), sleep(10_000)])
      const term = (c: string): { exitCode: number, finishedAt?: string } | undefined => statusesOf(ended).find(s => s.name === c)?.state?.terminated
      const [app, proxy] = [term('app'), term(PROXY)]
      const appLog = logs.app.text()
      const inFlight = /app: SIGTERM with request (\d+) in flight/.exec(appLog)?.[1]
      const finished = inFlight === undefined ? undefined : requestLines(appLog).find(q => q.n === Number(inFlight))?.status
      ok(inFlight !== undefined && finished === '200', `the app's request in flight at SIGTERM (#${inFlight ?? '?'}) completed: ${finished ?? 'not seen'}`, appLog.split('\n').slice(-6))
      const appExit = Date.parse(/app: exit at (\S+)/.exec(appLog)?.[1] ?? '')
      const log = jsonLines(logs.proxy.text())
      const drain = log.find(l => typeof l.msg === 'string' && l.msg.startsWith('draining'))
      const drainAt = Date.parse(typeof drain?.time === 'string' ? drain.time : '')
      const iso = (ms: number): string => Number.isNaN(ms) ? 'not logged' : new Date(ms).toISOString()
      ok(app?.exitCode === 0 && proxy?.exitCode === 0, `exit codes: app ${app?.exitCode ?? '?'}, proxy ${proxy?.exitCode ?? '?'}`)
      ok(appExit <= drainAt, `the proxy was told to stop after the app had exited (app exit ${iso(appExit)}, proxy drain ${iso(drainAt)})`)
      // Not from deletionTimestamp: the kubelet's final delete (grace 0) moves it. finishedAt has whole seconds.
      const took = Math.round((Date.parse(proxy?.finishedAt ?? '') - deletedAt) / 100) / 10
      ok(took >= -1 && took <= grace, `the proxy exited ${took} s after the delete, within terminationGracePeriodSeconds (${grace})`)
      const errors = log.filter(l => Number(l.level) >= 50 || l.level === 'error' || l.level === 'fatal')
      ok(errors.length === 0 && log.length > 0, `nothing logged as an error by the proxy (${log.length} lines)`, errors)
    } finally {
      logs.app.stop()
      logs.proxy.stop()
      await k.patch(podPath, [{ op: 'remove', path: '/metadata/finalizers' }], 'json').catch(() => {})
      await k.remove(`/apis/apps/v1/namespaces/${APPS}/deployments/drainer`).catch(() => {})
    }
  })
}

export async function rotation (x: Context): Promise<void> {
  const k = x.cluster
  await section('rotation through the kubelet\'s atomic writer', async () => {
    const pod = await runningPod(k, APPS, 'app=looper')
    if (pod === undefined) { ok(false, 'the looper pod still runs'); return }
    const name = pod.metadata.name
    const ip = pod.status.podIP ?? '?'
    // As a real rotation goes: the new key issued first, the Secret updated, the old key revoked
    // once the new one is seen in use.
    x.upstream.accept(x.pairs.b)
    const from = (await appRequests(k, APPS, name)).length
    const t = Date.now()
    ok(await putSecret(k, x.pairs.b, 'replace'), 'Secret cos-credentials replaced with pair b')
    await until('a request signed with pair b', 120_000, () => x.upstream.requests().some(q => q.remote === ip && q.key === x.pairs.b.key) ? true : undefined, 1000)
    ok(true, `the running proxy signs with pair b ${seconds(t)} after the Secret changed (the kubelet's sync, then the ..data swap)`)
    x.upstream.revoke(x.pairs.a)
    await sleep(4000)
    const across = (await appRequests(k, APPS, name)).slice(from)
    const signed = x.upstream.requests().filter(q => q.remote === ip && Date.parse(q.t) >= t)
    const [withA, withB] = [signed.filter(q => q.key === x.pairs.a.key).length, signed.filter(q => q.key === x.pairs.b.key).length]
    ok(across.length >= 6 && across.every(q => q.status === '200') && signed.every(q => q.status === 200),
      `no failed request across the swap: ${across.length} requests from the Secret's update on, all 200 (${withA} signed with a, then ${withB} with b)`,
      across.filter(q => q.status !== '200'))
    const applied = metric(proxyMetrics(pod), 'cos_auth_proxy_credential_reloads_total', { result: 'applied' })
    ok(applied >= 2, `cos_auth_proxy_credential_reloads_total{result="applied"} ${applied} (the first pair, then b)`)

    const before = metric(proxyMetrics(pod), 'cos_auth_proxy_upstream_responses_total', { route: 'management', status_class: '4xx' })
    ok(await putSecret(k, x.pairs.c, 'replace'), 'Secret cos-credentials replaced with pair c, which the upstream does not know')
    await until(`a 401 in ${name}'s app log`, 120_000, async () => (await appRequests(k, APPS, name)).some(q => q.status === '401') ? true : undefined, 1000)
    const warn = (await jsonLog(k, APPS, name, PROXY)).find(l => typeof l.msg === 'string' && l.msg.startsWith('auth: the upstream answered 401'))
    ok(warn !== undefined && warn.accessKey === accessKeyHint(x.pairs.c.key) && warn.status === 401,
      `the proxy logged the documented warning: ${JSON.stringify(warn?.msg ?? 'none').slice(0, 90)}… accessKey ${String(warn?.accessKey)}, reread ${String(warn?.reread)}`)
    const after = metric(proxyMetrics(pod), 'cos_auth_proxy_upstream_responses_total', { route: 'management', status_class: '4xx' })
    ok(after > before, `cos_auth_proxy_upstream_responses_total{route="management",status_class="4xx"} ${before} → ${after}`)
    const raw = await logOf(k, APPS, name, PROXY)
    const leaked = Object.values(x.pairs).filter(p => raw.includes(p.secret))
    ok(leaked.length === 0 && raw.length > 0, `no secret of the three pairs in the proxy's log (${raw.split('\n').length} lines)`)
  })
}
