// reinvocationPolicy: IfNeeded, through the API server: a second mutating webhook,
// called after the injector (configurations are called in name order), changes the
// pod; the API server calls the injector again, which leaves it as it is.
import { readFileSync } from 'node:fs'
import { createServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { INJECT, INJECTED, pointAtLocal, WEBHOOK, type Context } from './injection.js'
import { equal, ok } from '../harness/checks.js'
import { get, isObject, list, str } from '../harness/cluster.js'

const LABELLER = '/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/zz-cos-test-labeller'

/** The injector's cos_auth_proxy_inject_skipped_total{reason="already_injected"}. */
async function alreadyInjected (x: Context): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${x.adminPort}/metrics`)
  const line = (await res.text()).split('\n').find(l => l.startsWith('cos_auth_proxy_inject_skipped_total{reason="already_injected"}'))
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1))
}

export async function reinvoked (x: Context): Promise<void> {
  // The same serving certificate as the injector's (127.0.0.1, the test's CA).
  const server = createServer({ cert: readFileSync(join(x.files.dir, 'tls', 'tls.crt')), key: readFileSync(join(x.files.dir, 'tls', 'tls.key')) }, (req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const review = JSON.parse(Buffer.concat(chunks).toString()) as unknown
      const labels = get(review, 'request', 'object', 'metadata', 'labels')
      const patch = [...isObject(labels) ? [] : [{ op: 'add', path: '/metadata/labels', value: {} }], { op: 'add', path: '/metadata/labels/labelled-by', value: 'zz' }]
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', response: { uid: str(review, 'request', 'uid'), allowed: true, patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(patch)).toString('base64') } }))
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  try {
    const port = (server.address() as AddressInfo).port
    const mwc = await x.c.read(`/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${x.mwcName}`)
    await x.c.create('/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations', {
      apiVersion: 'admissionregistration.k8s.io/v1',
      kind: 'MutatingWebhookConfiguration',
      metadata: { name: 'zz-cos-test-labeller' },
      webhooks: [{
        name: 'labeller.test.example.com',
        admissionReviewVersions: ['v1'],
        sideEffects: 'None',
        failurePolicy: 'Fail',
        timeoutSeconds: 5,
        reinvocationPolicy: 'Never',
        clientConfig: { url: `https://127.0.0.1:${port}/`, caBundle: str(mwc, 'webhooks', 0, 'clientConfig', 'caBundle') },
        namespaceSelector: { matchLabels: { 'cos-auth-proxy.io/injection': 'enabled' } },
        objectSelector: { matchLabels: { reinvoke: 'yes' } },
        rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }],
      }],
    })
    await pointAtLocal(x) // the configurations reach the admission plugin together
    const before = await alreadyInjected(x)
    const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'reinvoked', labels: { reinvoke: 'yes' }, annotations: { [INJECT]: 'true' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0' }] } }
    const stored = await x.c.create('/api/v1/namespaces/apps/pods', pod)
    equal(str(stored, 'metadata', 'labels', 'labelled-by'), 'zz', 'a second webhook, called after the injector, changed the pod')
    equal(list(stored, 'spec', 'initContainers').map(k => k.name), ['cos-auth-proxy'], 'one sidecar')
    equal(str(stored, 'metadata', 'annotations', INJECTED), x.version, `and ${INJECTED}`)
    const after = await alreadyInjected(x)
    ok(after > before, `the API server called ${WEBHOOK} again (reinvocationPolicy IfNeeded), which left the pod as it was (already_injected ${before} → ${after})`)
  } finally {
    await x.c.remove(LABELLER)
    await new Promise(resolve => server.close(resolve))
  }
}
