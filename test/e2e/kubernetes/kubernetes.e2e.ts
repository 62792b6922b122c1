// npm run test:kubernetes: the chart, the injector and injected pods against a
// real kube-apiserver (+ etcd + kube-controller-manager) on 127.0.0.1, from
// scripts/kube-control-plane.sh. Not part of `npm test` (tap runs
// test/**/*.test.ts; nothing here is named so). Ends with "N passed, N failed".
//
// Without the built binaries it says how to build them and exits 2 (skipped,
// never green). env: HELM (default: helm on PATH), KUBECTL (for the doc blocks;
// default: the control plane's own, then kubectl on PATH), COS_KUBE_* as the
// script reads them, COS_KUBE_TIMEOUT_S (default 1200: the whole run),
// COS_KUBE_ONLY (default installs,injection,docs,renders: the parts to run).
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer, type AddressInfo, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { docWalkthroughs } from './doc-walkthroughs.js'
import { failures } from './failures.js'
import { Helm } from './helm.js'
import { injection } from './injection.js'
import { installs } from './installs.js'
import { renders } from './renders.js'
import { Cluster, controlPlane, killChildren, parseExports, run, SCRIPT, setScratchBase, str } from './kube.js'
import { section, skipRunner, stopOnInterruption, summary } from './report.js'
import { CLI } from './webhook.js'

/** A free port on 127.0.0.1 (with `pair`, one whose next port is free too: etcd's peer port). */
async function freePort (pair = false): Promise<number> {
  const listen = (port: number): Promise<Server | undefined> => new Promise(resolve => {
    const server = createServer()
    server.once('error', () => { resolve(undefined) })
    server.listen(port, '127.0.0.1', () => { resolve(server) })
  })
  for (let i = 0; i < 20; i++) {
    const first = await listen(0)
    if (first === undefined) continue
    const port = (first.address() as AddressInfo).port
    const second = pair && port < 65535 ? await listen(port + 1) : undefined
    await new Promise(resolve => first.close(resolve))
    if (second !== undefined) await new Promise(resolve => second.close(resolve))
    if (!pair || second !== undefined) return port
  }
  throw new Error('no free port on 127.0.0.1')
}

const skipped = (why: string, how: string): never => skipRunner('kubernetes', why, how)

async function main (): Promise<number> {
  if (controlPlane('built').code !== 0) {
    skipped(`no control plane binaries in the cache (${controlPlane('bin').stdout.trim()})`,
      `build them once (about 10 min on 2 cores, more on a busy machine; Go >= 1.26 and the Go module proxy needed):\n  ${process.env.COS_KUBE_VERSION === undefined ? '' : `COS_KUBE_VERSION=${process.env.COS_KUBE_VERSION} `}bash ${SCRIPT} build\nthen run npm run test:kubernetes again`)
  }
  const helmBin = process.env.HELM ?? 'helm'
  if ((await run(helmBin, ['version', '--short'])).code !== 0) {
    skipped(`no helm (${helmBin})`, 'install helm 3.8+ or 4, or set HELM=/path/to/helm (HELM=$(bash scripts/tools/get-helm.sh), as CI does)')
  }
  if (!existsSync(CLI)) skipped(`no ${CLI}`, 'run npm run build first')

  const runDir = mkdtempSync(join(tmpdir(), 'cos-kube-run-'))
  // Ports the kernel has just handed out, so two runs on one machine do not meet.
  const [apiPort, etcdPort, kcmPort] = [await freePort(), await freePort(true), await freePort()]
  const env = { ...process.env, COS_KUBE_RUN: runDir, COS_KUBE_PORT: String(apiPort), COS_KUBE_ETCD_PORT: String(etcdPort), COS_KUBE_KCM_PORT: String(kcmPort) }
  setScratchBase(runDir)
  let stopped = false
  const stop = (): void => {
    if (stopped) return
    stopped = true
    killChildren()
    const r = controlPlane('stop', env)
    if (r.stderr.trim() !== '') console.log(r.stderr.trim())
    rmSync(runDir, { recursive: true, force: true })
  }
  stopOnInterruption('kubernetes', Number(process.env.COS_KUBE_TIMEOUT_S ?? '1200'), stop)

  const t0 = Date.now()
  const started = controlPlane('start', env)
  if (started.code !== 0) {
    console.log(`${started.stdout}${started.stderr}`)
    console.log('0 passed, 1 failed')
    return 1
  }
  console.log(started.stdout.trim())
  console.log(`# control plane started in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
  const c = new Cluster(parseExports(controlPlane('env', env).stdout))
  const version = await c.read('/version')
  console.log(`kubernetes: server ${str(version, 'gitVersion') ?? '?'} (${str(version, 'goVersion') ?? '?'}), etcd ${(await run(join(controlPlane('bin').stdout.trim(), 'etcd'), ['--version'])).stdout.split('\n')[0] ?? '?'}, helm ${(await run(helmBin, ['version', '--short'])).stdout.trim()}`)
  const helm = new Helm(helmBin, c)
  try {
    const only = process.env.COS_KUBE_ONLY ?? 'installs,injection,docs,renders'
    if (only.includes('injection')) await injection(c, helm, failures)
    if (only.includes('installs')) await installs(c, helm)
    if (only.includes('docs')) await docWalkthroughs(c, helm)
    if (only.includes('renders')) await renders(c, helm)
  } catch (err) {
    await section('unexpected', () => Promise.reject(err instanceof Error ? err : new Error(String(err))))
  } finally {
    rmSync(helm.homeDir, { recursive: true, force: true })
  }
  const tests = Date.now()
  stop() // before the closing line, so that it is the last one
  const s = summary()
  console.log(`# tests ${((tests - t0) / 1000).toFixed(1)} s (control plane start included), stop ${((Date.now() - tests) / 1000).toFixed(1)} s`)
  if (s.failures.length > 0) console.log(`failed:\n${s.failures.map(f => `  ${f}`).join('\n')}`)
  console.log(`${s.passed} passed, ${s.failed} failed`)
  return s.failed === 0 ? 0 : 1
}

main().then(code => { process.exitCode = code }, (err: unknown) => {
  console.log(err instanceof Error ? err.stack : String(err))
  console.log(`${summary().passed} passed, ${summary().failed + 1} failed`)
  process.exitCode = 1
})
