// What helm prints and renders, as a user and a GitOps tool see it (issue 37):
// the NOTES of each mode after `helm install`, and whether two `helm template`
// renders are byte-identical (Argo CD and template-based Flux setups render
// with `helm template` on every sync: a render that changes is a permanent
// diff and a new webhook certificate each time).
import { join } from 'node:path'
import type { Helm } from './helm.js'
import { equal, ok, section } from '../harness/checks.js'
import { type Cluster } from '../harness/cluster.js'
import { ROOT } from '../harness/processes.js'

const CHART = join(ROOT, 'helm', 'cos-auth-proxy')
const ci = (file: string): string => join(CHART, 'ci', file)

/** The NOTES of `helm install --dry-run=server` (the API server answers lookups; nothing is stored). */
async function notes (helm: Helm, release: string, ns: string, args: readonly string[]): Promise<string> {
  const out = await helm.must(['install', release, CHART, ...args, '--namespace', ns, '--dry-run=server'])
  const at = out.indexOf('\nNOTES:\n')
  return at < 0 ? '' : out.slice(at + 8)
}

async function notesPerMode (helm: Helm): Promise<void> {
  const sidecar = await notes(helm, 'cos-auth-proxy', 'default', ['--set', 'upstream.managementUrl=https://management.cos.example.com/api'])
  ok(sidecar.includes('is in sidecar mode: this release renders no workload by itself'), 'sidecar mode: the NOTES say the release renders no workload and how a parent chart includes the sidecar', sidecar)
  ok(sidecar.includes('include "cos-auth-proxy.sidecar.container" $cos') && sidecar.includes('if not $cos.Values.sidecar.native'), 'sidecar mode: the excerpt has the native and the plain-container branch', sidecar)

  const standalone = await notes(helm, 'cos-auth-proxy', 'default', ['--set', 'mode=deployment', '--set', 'upstream.managementUrl=https://management.cos.example.com/api', '--set', 'credentials.existingSecret=cos-credentials', '--set', 'proxy.allowFrom={10.0.0.0/8}'])
  ok(standalone.includes('runs as a Deployment: cos-auth-proxy in namespace default'), 'standalone: the NOTES name the Deployment and its namespace', standalone)
  ok(standalone.includes('http://cos-auth-proxy.default.svc:8080/management/'), 'standalone: and the Service URL clients use (release cos-auth-proxy: Service cos-auth-proxy)', standalone)
  ok(!standalone.includes('injection webhook'), 'standalone: nothing about a webhook it does not render', standalone)

  const injector = await notes(helm, 'cos', 'cos-system', ['-f', ci('injector-gitops-values.yaml')])
  ok(injector.includes('this release is the injection webhook; it runs no proxy of its own'), 'injector: the NOTES say what the release is', injector)
  ok(!injector.includes('renders no workload by itself'), 'injector: not the sidecar mode\'s NOTES (issue 37)', injector)
  for (const [what, text] of [
    ['the rollout to wait for', 'kubectl -n cos-system rollout status deployment/cos-cos-auth-proxy-injector'],
    ['the namespace label', 'kubectl label namespace <namespace> cos-auth-proxy.io/injection=enabled'],
    ['the Secret per namespace, named as injector.defaultSecret', 'kubectl -n <namespace> create secret generic cos-credentials'],
    ['the annotation', 'cos-auth-proxy.io/inject: "true"'],
    ['where the app finds the proxy', '$COS_PROXY_URL (http://127.0.0.1:8080)'],
    ['that the renders are stable with a Secret the user manages', 'Secret cos-injector-tls, which you manage; renders are stable'],
  ] as const) ok(injector.includes(text), `injector: the NOTES give ${what}`, injector)
  const helmCa = await notes(helm, 'cos', 'cos-system', ['-f', ci('injector-values.yaml')])
  ok(helmCa.includes('That is for helm install/upgrade') && helmCa.includes('Use injector.certManager.enabled'), 'injector with the Helm-made CA: the NOTES say it is for helm install/upgrade only, and what to use with GitOps', helmCa)
}

async function template (helm: Helm, values: string): Promise<string> {
  return await helm.must(['template', 'cos', CHART, '--namespace', 'cos-system', '--kube-version', '1.31', '-f', values])
}

async function gitopsRenders (helm: Helm): Promise<void> {
  for (const file of ['injector-cert-manager-values.yaml', 'injector-gitops-values.yaml']) {
    const [first, second] = [await template(helm, ci(file)), await template(helm, ci(file))]
    ok(first.includes('kind: MutatingWebhookConfiguration'), `${file}: the render has the webhook`)
    equal(first === second, true, `${file}: two helm template renders are byte-identical (${first.length} bytes)`)
  }
  const [a, b] = [await template(helm, ci('injector-values.yaml')), await template(helm, ci('injector-values.yaml'))]
  equal(a === b, false, 'the Helm-made CA (the default): two helm template renders differ, as the docs say (helm install/upgrade only)')
}

export async function renders (_c: Cluster, helm: Helm): Promise<void> {
  await section('helm install NOTES per mode (sidecar, standalone, injector)', () => notesPerMode(helm))
  await section('helm template with the GitOps settings: stable renders', () => gitopsRenders(helm))
}
