// Making a cluster is its own concern: scripts/kube-control-plane.sh (etcd, kube-apiserver and
// kube-controller-manager on 127.0.0.1) as the kubernetes suite starts and stops it. The checks
// talk to it only through the kubeconfig it writes (./cluster.ts).
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { ROOT, type Run } from './processes.js'

export const SCRIPT = join(ROOT, 'scripts', 'kube-control-plane.sh')

/** `scripts/kube-control-plane.sh <command>`, synchronously (built, bin, start, stop, env). */
export function controlPlane (command: string, env: NodeJS.ProcessEnv = process.env): Run {
  const r = spawnSync('bash', [SCRIPT, command], { env, encoding: 'utf8', timeout: 300_000 })
  return { code: r.status ?? 1, stdout: r.stdout, stderr: r.stderr }
}

/** `export A=b` lines → a record. */
export function parseExports (text: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const m of text.matchAll(/^export ([A-Z_]+)=(.*)$/gm)) out[m[1] as string] = m[2] as string
  return out
}
