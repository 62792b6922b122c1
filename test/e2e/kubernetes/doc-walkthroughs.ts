// A platform engineer's first day (issue 37): every shell block of
// docs/kubernetes.md and the chart README that installs or creates something is
// run here as written, in the order a reader meets it, against the real API
// server, with the suite's helm and a kubectl; then what it stored is checked
// against what the text says. A block that cannot run here is marked in the
// doc (<!-- not run by test:kubernetes: why -->) and listed. Each walk-through
// starts without the namespaces it uses and leaves none of them behind.
import { randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { blocks, CLAIMS, consoleParts, DOCS, find, inventory, K8S, PLACEHOLDERS, README, runScript, substitute, toolDir, WALKTHROUGHS, where, which, type Block, type ClaimName } from './doc-blocks.js'
import { objectPath, parseYamlDocs, type Helm } from './helm.js'
import { INJECTED, MWC, NAME, NS, RELEASE, servingSecret } from './injection.js'
import { equal, ok, section } from '../harness/checks.js'
import { type Cluster, get, list, str } from '../harness/cluster.js'
import { controlPlane } from '../harness/control-plane.js'
import { ROOT, type Run, run, scratch, until } from '../harness/processes.js'
import { Webhook, WebhookFiles } from './webhook.js'

const PARENT = join(ROOT, 'examples', 'sidecar-parent-chart')

interface Context {
  readonly c: Cluster
  readonly helm: Helm
  readonly env: NodeJS.ProcessEnv
  readonly home: string
  readonly all: readonly Block[]
}

/** Runs a claimed block as written (placeholders aside); throws when it fails, which ends the walk-through. */
async function runBlock (x: Context, name: ClaimName): Promise<Run> {
  const [b] = find(x.all, CLAIMS[name])
  if (b === undefined) throw new Error(`no block for ${name}`)
  const { text, unknown } = substitute(b.lang === 'console' ? consoleParts(b.text).commands : b.text)
  equal(unknown, [], `${where(b)}: every placeholder is in the table`)
  const t0 = Date.now()
  const r = await runScript(text, x.env)
  const first = text.split('\n').find(l => l.trim() !== '' && !l.trim().startsWith('#')) ?? ''
  if (!ok(r.code === 0, `${where(b)}: ran as written, exit 0 in ${((Date.now() - t0) / 1000).toFixed(1)} s (${first.trim().slice(0, 90)}…)`, { code: r.code, stderr: r.stderr.slice(-1500) })) {
    throw new Error(`${where(b)} failed: ${r.stderr.trim().split('\n').slice(-3).join(' | ')}`)
  }
  return r
}

/** Deletes what a walk-through made: its releases (cluster-scoped objects too), then its namespaces, and waits for them to go. */
async function clean (x: Context, releases: readonly (readonly [string, string])[], namespaces: readonly string[]): Promise<void> {
  for (const [release, ns] of releases) if (await x.helm.status(release, ns) !== undefined) await x.helm.must(['uninstall', release, '--namespace', ns])
  for (const ns of namespaces) await x.c.remove(`/api/v1/namespaces/${ns}`)
  // A block that forgets its namespace puts the Secret here (issue 37): the next walk-through must not find it.
  await x.c.remove('/api/v1/namespaces/default/secrets/cos-credentials')
  await until(`namespaces ${namespaces.join(', ')} deleted`, 180_000, async () => {
    for (const ns of namespaces) if (await x.c.find(`/api/v1/namespaces/${ns}`) !== undefined) return undefined
    return true
  })
}

/** The Secret the key-pair block made holds the two files, byte for byte (never printed). */
async function secretFromFiles (x: Context, ns: string): Promise<void> {
  const s = await x.c.find(`/api/v1/namespaces/${ns}/secrets/cos-credentials`)
  ok(s !== undefined, `Secret cos-credentials is in ${ns}, where the pods that mount it are`)
  const same = ['access-key', 'access-key-secret'].every(k => Buffer.from(str(s, 'data', k) ?? '', 'base64').equals(readFileSync(join(x.home, '.config', 'cos-auth-proxy', k))))
  ok(same, 'its keys access-key and access-key-secret hold the two files (contents compared, not printed)')
}

/** Secrets mounted by the Deployments and Pods of a namespace that do not exist there (the kubelet's FailedMount). */
async function missingSecrets (x: Context, ns: string): Promise<string[]> {
  const specs: [string, unknown][] = [
    ...(await x.c.items(`/apis/apps/v1/namespaces/${ns}/deployments`)).map((d): [string, unknown] => [`deployment/${str(d, 'metadata', 'name') ?? ''}`, get(d, 'spec', 'template', 'spec')]),
    ...(await x.c.items(`/api/v1/namespaces/${ns}/pods`)).map((p): [string, unknown] => [`pod/${str(p, 'metadata', 'name') ?? ''}`, get(p, 'spec')]),
  ]
  const missing: string[] = []
  for (const [what, spec] of specs) {
    for (const v of list(spec, 'volumes')) {
      const name = str(v, 'secret', 'secretName')
      if (name !== undefined && await x.c.find(`/api/v1/namespaces/${ns}/secrets/${name}`) === undefined) missing.push(`${what} mounts Secret ${name}, not in ${ns}`)
    }
  }
  ok(specs.length > 0, `${ns}: ${specs.length} Deployments and Pods looked at`)
  return missing
}

async function mountsExisting (x: Context, ns: string): Promise<void> {
  equal(await missingSecrets(x, ns), [], `every Secret the Deployments and Pods of ${ns} mount exists in ${ns}`)
}

async function sidecarWalkthrough (x: Context): Promise<void> {
  const charts = join(PARENT, 'charts')
  const made = !existsSync(charts) || !readdirSync(charts).some(f => f.startsWith('cos-auth-proxy-'))
  try {
    await runBlock(x, 'keyPair')
    await secretFromFiles(x, 'apps')
    const r = await runBlock(x, 'parentBuild')
    const [b] = find(x.all, CLAIMS.parentBuild)
    const shown = consoleParts(b?.text ?? '').shown.filter(l => l.trim() !== '…')
    const out = r.stdout.split('\n').map(l => l.trimEnd())
    const at = out.findIndex((_, i) => shown.every((l, j) => out[i + j] === l))
    ok(shown.length >= 5 && at >= 0, `helm template prints the ${shown.length} lines the console block shows, as shown`, { shown })
    await runBlock(x, 'parentInstall')
    equal(await x.helm.status('my-app', 'apps'), 'deployed', 'helm install my-app: deployed')
    const pods = await x.c.waitPods('apps', 'app.kubernetes.io/instance=my-app', 2)
    equal(list(pods[0], 'spec', 'initContainers').map(k => [k.name, k.restartPolicy]), [['cos-auth-proxy', 'Always']], 'its pods (2, as the text says) have the native sidecar')
    await mountsExisting(x, 'apps')
  } finally {
    if (made) rmSync(charts, { recursive: true, force: true })
  }
}

/** A standalone install: what the text says it renders, where the Service is, and that the pods can mount their Secret. */
async function standaloneStored (x: Context, r: Run, addresses: readonly string[]): Promise<void> {
  equal(await x.helm.status('cos-auth-proxy', 'apps'), 'deployed', 'helm install cos-auth-proxy: deployed')
  const manifest = await x.helm.manifest('cos-auth-proxy', 'apps')
  const kinds = [...new Set(manifest.map(o => str(o, 'kind') ?? ''))].sort()
  equal(kinds, ['Deployment', 'NetworkPolicy', 'PodDisruptionBudget', 'Service', 'ServiceAccount'], 'it renders a Deployment, Service, ServiceAccount, PodDisruptionBudget and NetworkPolicy')
  const missing: string[] = []
  for (const o of manifest) if (await x.c.find(objectPath(o, 'apps')) === undefined) missing.push(objectPath(o, 'apps'))
  equal(missing, [], 'all of them stored in apps')
  const sa = manifest.find(o => o.kind === 'ServiceAccount')
  equal(get(await x.c.read(objectPath(sa ?? {}, 'apps')), 'automountServiceAccountToken'), false, 'the ServiceAccount: automountServiceAccountToken false')
  const d = await x.c.read('/apis/apps/v1/namespaces/apps/deployments/cos-auth-proxy')
  const envVar = (name: string): string | undefined => str(list(d, 'spec', 'template', 'spec', 'containers', 0, 'env').find(e => e.name === name), 'value')
  const allowFrom = envVar('COS_ALLOW_FROM') ?? ''
  ok(allowFrom.split(',').includes('10.0.0.0/8'), `proxy.allowFrom reaches COS_ALLOW_FROM (${allowFrom})`)
  equal(envVar('COS_MANAGEMENT_API_URL'), `https://${PLACEHOLDERS['<management-host>'] ?? ''}/${PLACEHOLDERS['<base-path>'] ?? ''}`, 'upstream.managementUrl reaches COS_MANAGEMENT_API_URL')
  ok(addresses.length > 0, `the text gives the address: ${addresses.join(', ')}`)
  for (const address of addresses) {
    const m = /^http:\/\/([^.]+)\.([^.]+)\.svc:(\d+)\//.exec(address)
    const svc = m === null ? undefined : await x.c.find(`/api/v1/namespaces/${m[2] ?? ''}/services/${m[1] ?? ''}`)
    ok(svc !== undefined && list(svc, 'spec', 'ports').some(p => p.port === Number(m?.[3])), `${address}: Service ${m?.[1] ?? '?'} in ${m?.[2] ?? '?'} has port ${m?.[3] ?? '?'}`)
    ok(r.stdout.includes(address), `helm install's notes print ${address}`)
  }
  await x.c.waitPods('apps', 'app.kubernetes.io/instance=cos-auth-proxy', 2)
  await mountsExisting(x, 'apps')
}

/** The addresses a doc gives for the standalone Service. */
function addresses (doc: string, section: string): string[] {
  const text = readFileSync(join(ROOT, doc), 'utf8')
  const start = text.indexOf(section)
  const body = text.slice(start, text.indexOf('\n## ', start + 1))
  return [...new Set([...body.matchAll(/http:\/\/[a-z0-9-]+\.[a-z0-9-]+\.svc:\d+\/(?:management|optimize)\//g)].map(m => m[0]))]
}

async function standaloneWalkthrough (x: Context): Promise<void> {
  await runBlock(x, 'keyPair')
  await secretFromFiles(x, 'apps')
  await standaloneStored(x, await runBlock(x, 'standalone'), addresses(K8S, '## Standalone'))
}

async function readmeWalkthrough (x: Context): Promise<void> {
  await runBlock(x, 'readmeCredentials')
  await secretFromFiles(x, 'apps')
  await standaloneStored(x, await runBlock(x, 'readmeStandalone'), addresses(README, '## Standalone mode'))
}

async function injectionWalkthrough (x: Context): Promise<void> {
  const dir = scratch('doc-inject-')
  const files = new WebhookFiles(dir)
  let webhook: Webhook | undefined
  try {
    await runBlock(x, 'keyPair')
    // The one addition: a serving certificate for 127.0.0.1, in the Secret the chart would make (it keeps it).
    await x.c.namespace(NS)
    await x.c.create(`/api/v1/namespaces/${NS}/secrets`, servingSecret(dir))
    await runBlock(x, 'injector')
    equal(await x.helm.status(RELEASE, NS), 'deployed', `helm install ${RELEASE}: deployed in ${NS}`)
    const own = await x.c.waitPods(NS, `app.kubernetes.io/instance=${RELEASE}`, 2)
    ok(own.length === 2, `the webhook's Deployment ${NAME} made its 2 pods (Pending: no kubelet, so rollout status is not run)`)
    // No kube-proxy here: the webhook runs on 127.0.0.1 as the chart configures it, and only the clientConfig points there.
    await files.fromSecret(x.c, NS, `${NAME}-tls`)
    await files.fromConfigMap(x.c, NS, `${NAME}-sidecar`)
    const env = await files.env(x.c, NS, NAME)
    equal(env.COS_INJECT_DEFAULT_SECRET, 'cos-credentials', 'injector.defaultSecret=cos-credentials reaches the webhook')
    webhook = new Webhook(env)
    const listening = await webhook.start()
    const mwc = await x.c.read(MWC)
    await x.c.patch(MWC, [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url: `https://127.0.0.1:${listening.port}/mutate`, caBundle: str(mwc, 'webhooks', 0, 'clientConfig', 'caBundle') } }], 'json')
    // The API server's informer has the new clientConfig once a pod in a labelled namespace is patched.
    await x.c.namespace('doc-probe', { 'cos-auth-proxy.io/injection': 'enabled' })
    const probe = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'probe', annotations: { 'cos-auth-proxy.io/inject': 'true' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1' }] } }
    await until('the API server calling the webhook', 30_000, async () => {
      const r = await x.c.call('POST', '/api/v1/namespaces/doc-probe/pods?dryRun=All', probe)
      return r.status === 201 && str(r.body, 'metadata', 'annotations', INJECTED) !== undefined ? true : undefined
    })
    await x.c.remove('/api/v1/namespaces/doc-probe')
    const r = await runBlock(x, 'annotate')
    const [b] = find(x.all, CLAIMS.annotate)
    const said = /jsonpath=.*#\s*(\S+)\s*$/m.exec(b?.text ?? '')?.[1]
    equal(r.stdout.trimEnd().split('\n').at(-1), said, `the block's last command prints what its comment says (${said ?? '?'})`)
    equal(str(await x.c.read('/api/v1/namespaces/apps'), 'metadata', 'labels', 'cos-auth-proxy.io/injection'), 'enabled', 'namespace apps is labelled')
    const pod = await x.c.read('/api/v1/namespaces/apps/pods/demo')
    equal(list(pod, 'spec', 'initContainers').map(k => [k.name, k.restartPolicy]), [['cos-auth-proxy', 'Always']], 'the stored pod demo has the native sidecar')
    const credentials = list(pod, 'spec', 'volumes').find(v => v.name === 'cos-auth-proxy-credentials')
    equal(str(credentials, 'secret', 'secretName'), 'cos-credentials', 'its credentials volume is the Secret cos-credentials (injector.defaultSecret)')
    await mountsExisting(x, 'apps')
    const app = list(pod, 'spec', 'containers').find(k => k.name === 'app')
    equal(list(app, 'env').find(e => e.name === 'COS_PROXY_URL')?.value, 'http://127.0.0.1:8080', 'the app container has COS_PROXY_URL=http://127.0.0.1:8080, which the curl uses')
    equal(str(pod, 'metadata', 'annotations', INJECTED), listening.version, `${INJECTED} is the webhook's version`)
  } finally {
    await webhook?.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}

/** The fail-open alert docs/kubernetes.md quotes is the one helm renders. */
async function failOpenQuote (x: Context): Promise<void> {
  const r = await x.helm.run(['template', 'cos', join(ROOT, 'helm', 'cos-auth-proxy'), '--namespace', 'cos-system', '--set', 'injector.enabled=true', '--set', 'prometheusRule.enabled=true',
    '--set', 'prometheusRule.runbookBaseUrl=https://example.com/operations.md', '--set', 'upstream.managementUrl=https://management.cos.example.com/api'])
  if (!ok(r.code === 0, 'helm template with injector.enabled and prometheusRule.enabled', r.stderr.slice(0, 800))) return
  const rule = parseYamlDocs(r.stdout).find(o => o.kind === 'PrometheusRule')
  const expr = list(rule, 'spec', 'groups').flatMap(g => list(g, 'rules')).find(k => k.alert === 'CosAuthProxyInjectorFailOpen')?.expr
  ok(typeof expr === 'string', `CosAuthProxyInjectorFailOpen rendered: ${String(expr)}`)
  ok(readFileSync(join(ROOT, K8S), 'utf8').includes(`\`${String(expr).trim()}\``), 'docs/kubernetes.md quotes that expression whole')
  const selector = /`(apiserver_admission_webhook_fail_open_count\{[^}]*\})`/.exec(readFileSync(join(ROOT, 'docs', 'operations.md'), 'utf8'))?.[1]
  ok(selector !== undefined && String(expr).includes(selector), `docs/operations.md's series (${selector ?? 'none'}) is the one it reads`)
}

/** The kubectl the blocks run: KUBECTL, the control plane's own (scripts/kube-node.sh build makes it), or one on PATH. */
function kubectl (): string | undefined {
  const own = join(controlPlane('bin').stdout.trim(), 'kubectl')
  for (const candidate of [process.env.KUBECTL, existsSync(own) ? own : undefined, 'kubectl']) {
    if (candidate === undefined || candidate === '') continue
    const path = which(candidate)
    if (path !== undefined && existsSync(path)) return path
  }
  return undefined
}

export async function docWalkthroughs (c: Cluster, helm: Helm): Promise<void> {
  const all = DOCS.flatMap(d => blocks(d))
  await section('doc blocks: every shell block of docs/kubernetes.md and the chart README, run here or marked', async () => { inventory(all) })
  const home = scratch('doc-home-')
  const keys = join(home, '.config', 'cos-auth-proxy')
  mkdirSync(keys, { recursive: true })
  writeFileSync(join(keys, 'access-key'), `doc-blocks-${randomBytes(4).toString('hex')}`, { mode: 0o600 })
  writeFileSync(join(keys, 'access-key-secret'), randomBytes(24).toString('base64url'), { mode: 0o600 })
  const bin = scratch('doc-bin-')
  const kube = kubectl()
  const helmPath = which(helm.bin)
  if (kube === undefined || helmPath === undefined) {
    await section('doc blocks: tools', async () => {
      ok(false, `a kubectl for the blocks (KUBECTL=/path/to/kubectl, or bash scripts/kube-node.sh build, which builds the control plane's own) and helm (${helm.bin}): ${kube ?? 'no kubectl'}, ${helmPath ?? 'no helm'}`)
    })
    return
  }
  toolDir(bin, { helm: helmPath, kubectl: kube })
  const version = /"gitVersion":\s*"([^"]+)"/.exec((await run(kube, ['version', '--client', '-o', 'json'])).stdout)?.[1] ?? '?'
  console.log(`    kubectl ${kube} (${version}), helm ${helmPath}; HOME: a directory with the two key files`)
  // HOME holds the key files the blocks name ($HOME/.config/cos-auth-proxy/…) and helm's and kubectl's own state.
  const x: Context = { c, helm, all, home, env: { PATH: `${bin}:${process.env.PATH ?? ''}`, HOME: home, KUBECONFIG: c.kubeconfig } }
  // The other sections leave apps and cos-system behind; each walk-through starts without them.
  const namespaces = ['apps', NS, 'doc-probe']
  await section('doc blocks: a cluster without the namespaces the docs use', () => clean(x, [], namespaces))
  const walk = async (name: string, body: (x: Context) => Promise<void>, releases: readonly (readonly [string, string])[]): Promise<void> => {
    await section(`doc blocks: ${name} (${(WALKTHROUGHS[name] ?? []).join(', ')})`, async () => {
      try {
        await body(x)
      } finally {
        await clean(x, releases, namespaces)
      }
    })
  }
  await walk('docs/kubernetes.md, as a sidecar', sidecarWalkthrough, [['my-app', 'apps']])
  await walk('docs/kubernetes.md, standalone', standaloneWalkthrough, [['cos-auth-proxy', 'apps']])
  await walk('docs/kubernetes.md, injection', injectionWalkthrough, [[RELEASE, NS]])
  await walk('chart README, standalone', readmeWalkthrough, [['cos-auth-proxy', 'apps']])
  await section('doc blocks: the fail-open alert docs/kubernetes.md quotes is the rendered one', () => failOpenQuote(x))
}
