// An OCI registry on loopback for the release test: go-containerregistry's
// `crane registry serve` (manifests of any media type, so images, indexes,
// Helm charts, cosign signatures and attestations), its blobs in a temporary
// directory, stopped and removed by stop().
import { spawn } from 'node:child_process'
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { freePort } from '../harness/processes.js'

export interface Registry {
  /** 127.0.0.1:PORT */
  host: string
  pid: number
  /** Resolves once the process has exited (after stop()). */
  exited: Promise<void>
  stop: () => void
}

export async function startRegistry (crane: string): Promise<Registry> {
  const dir = mkdtempSync(join(tmpdir(), 'cos-release-registry-'))
  const blobs = join(dir, 'blobs')
  mkdirSync(blobs)
  const port = await freePort()
  const host = `127.0.0.1:${port}`
  // Its log (a line per request) to a file, never to a pipe: this process waits in
  // spawnSync for minutes and would not read one, and the registry, blocked writing
  // its log to a full pipe, would stop answering (it did: cosign waited 120 s).
  const log = join(dir, 'registry.log')
  const fd = openSync(log, 'w')
  const child = spawn(crane, ['registry', 'serve', '--address', host, '--disk', blobs], { stdio: ['ignore', 'ignore', fd] })
  closeSync(fd)
  const exited = new Promise<void>(resolve => child.once('exit', () => { resolve() }))
  let stopped = false
  const stop = (): void => {
    if (stopped) return
    stopped = true
    child.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
  for (let i = 0; i < 100; i++) {
    if (child.exitCode !== null) break
    const up = await fetch(`http://${host}/v2/`).then(r => r.status === 200, () => false)
    if (up) return { host, pid: child.pid ?? 0, exited, stop }
    await sleep(100)
  }
  const said = readFileSync(log, 'utf8').slice(-4000).trim()
  stop()
  throw new Error(`crane registry serve did not answer on ${host}: ${said}`)
}
