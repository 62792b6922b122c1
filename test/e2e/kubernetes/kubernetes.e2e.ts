// npm run test:kubernetes: the chart, the injector and injected pods against a
// real kube-apiserver (+ etcd + kube-controller-manager) on 127.0.0.1, from
// scripts/kube-control-plane.sh. A tap file, not part of `npm test` (that runs
// test/**/*.test.ts). The checks talk to the cluster only through the kubeconfig
// the script writes (../harness/cluster.ts).
//
// Without the built binaries, helm or the bundle it is one skipped test that says
// how to get them (CI counts a skip as a failure). env: HELM (default: helm on
// PATH), KUBECTL (for the doc blocks; default: the control plane's own, then
// kubectl on PATH), COS_KUBE_* as the script reads them, COS_KUBE_TIMEOUT_S
// (default 1200: the whole run), COS_KUBE_ONLY (default
// installs,injection,docs,renders: the parts to run).
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { suite } from '../harness/checks.js'
import { Cluster, str } from '../harness/cluster.js'
import { controlPlane, parseExports, SCRIPT } from '../harness/control-plane.js'
import { freePort, killChildren, run, seconds, setScratchBase, sh } from '../harness/processes.js'
import { docWalkthroughs } from './doc-walkthroughs.js'
import { failures } from './failures.js'
import { Helm } from './helm.js'
import { injection } from './injection.js'
import { installs } from './installs.js'
import { renders } from './renders.js'
import { CLI } from './webhook.js'

const helmBin = process.env.HELM ?? 'helm'
let runDir = ''
let env: NodeJS.ProcessEnv = process.env
let helm: Helm | undefined
let stopped = false
/** Everything down (once): the suite's children, the control plane, the run directory. */
const stop = (): void => {
  if (stopped) return
  stopped = true
  killChildren()
  if (env.COS_KUBE_RUN !== undefined) {
    const r = controlPlane('stop', env)
    if (r.stderr.trim() !== '') console.log(r.stderr.trim())
  }
  if (helm !== undefined) rmSync(helm.homeDir, { recursive: true, force: true })
  if (runDir !== '') rmSync(runDir, { recursive: true, force: true })
}

suite('kubernetes', {
  prerequisites: [
    () => controlPlane('built').code === 0
      ? undefined
      : {
          why: `no control plane binaries in the cache (${controlPlane('bin').stdout.trim()})`,
          how: `build them once (about 10 min on 2 cores, more on a busy machine; Go >= 1.26 and the Go module proxy needed):\n  ${process.env.COS_KUBE_VERSION === undefined ? '' : `COS_KUBE_VERSION=${process.env.COS_KUBE_VERSION} `}bash ${SCRIPT} build\nthen run npm run test:kubernetes again`,
        },
    () => sh(helmBin, ['version', '--short']).code === 0
      ? undefined
      : { why: `no helm (${helmBin})`, how: 'install helm 3.8+ or 4, or set HELM=/path/to/helm (HELM=$(bash scripts/tools/get-helm.sh), as CI does)' },
    () => existsSync(CLI) ? undefined : { why: `no ${CLI}`, how: 'run npm run build first' },
  ],
  timeoutS: Number(process.env.COS_KUBE_TIMEOUT_S ?? '1200'),
  stop,
  setUp: async () => {
    runDir = mkdtempSync(join(tmpdir(), 'cos-kube-run-'))
    // Ports the kernel has just handed out, so two runs on one machine do not meet.
    const [apiPort, etcdPort, kcmPort] = [await freePort(), await freePort(true), await freePort()]
    env = { ...process.env, COS_KUBE_RUN: runDir, COS_KUBE_PORT: String(apiPort), COS_KUBE_ETCD_PORT: String(etcdPort), COS_KUBE_KCM_PORT: String(kcmPort) }
    setScratchBase(runDir)
    const t0 = Date.now()
    const started = controlPlane('start', env)
    if (started.code !== 0) throw new Error(`scripts/kube-control-plane.sh start: exit ${started.code}\n${started.stdout}${started.stderr}`)
    console.log(started.stdout.trim())
    console.log(`control plane started in ${seconds(t0)}`)
    const kubeconfig = parseExports(controlPlane('env', env).stdout).KUBECONFIG
    if (kubeconfig === undefined) throw new Error(`KUBECONFIG missing from '${SCRIPT} env'`)
    const c = new Cluster(kubeconfig)
    const version = await c.read('/version')
    console.log(`kubernetes: server ${str(version, 'gitVersion') ?? '?'} (${str(version, 'goVersion') ?? '?'}), etcd ${(await run(join(controlPlane('bin').stdout.trim(), 'etcd'), ['--version'])).stdout.split('\n')[0] ?? '?'}, helm ${(await run(helmBin, ['version', '--short'])).stdout.trim()}`)
    helm = new Helm(helmBin, c)
    return { c, helm }
  },
}, async ({ c, helm }) => {
  const only = process.env.COS_KUBE_ONLY ?? 'installs,injection,docs,renders'
  if (only.includes('injection')) await injection(c, helm, failures)
  if (only.includes('installs')) await installs(c, helm)
  if (only.includes('docs')) await docWalkthroughs(c, helm)
  if (only.includes('renders')) await renders(c, helm)
})
