// Bytes allocated per request, by function: `npm run bench:profile -- --alloc`.
// The server preloads bench/alloc-sampler.mjs; sampling covers the measured
// load only (SIGUSR2 before and after it).
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { table } from './format.js'
import { BENCH_DIR, ROOT } from './support/node.js'

interface Site { readonly name: string, readonly where: string, readonly bytes: number }
interface Sampled { readonly total: number, readonly sites: readonly Site[] }

export function allocNodeArgs (): string[] {
  return [`--import=${join(BENCH_DIR, 'alloc-sampler.mjs')}`]
}

export function startSampling (pid: number): void {
  process.kill(pid, 'SIGUSR2')
}

/** Ends the sampling and waits (up to 30 s) for the file it writes. */
export async function stopSampling (pid: number, file: string): Promise<Sampled> {
  process.kill(pid, 'SIGUSR2')
  for (let i = 0; i < 300 && !existsSync(file); i++) await sleep(100) // renamed into place when whole
  return JSON.parse(readFileSync(file, 'utf8')) as Sampled
}

export function allocReport (s: Sampled, requests: number, top = 25): string {
  const where = (w: string): string => w.replace(/^file:\/\//, '').replace(ROOT + '/', '').replace(/^.*\/node_modules\//, '')
  return [
    `### Allocated per request: ${Math.round(s.total / requests).toLocaleString('en-US')} bytes (${requests.toLocaleString('en-US')} requests; V8's sampling heap profiler, freed objects included)`,
    table(['function', 'where', 'bytes / request'], s.sites.slice(0, top).map(x => [x.name, where(x.where), Math.round(x.bytes / requests)])),
  ].join('\n')
}
