// helm against the test control plane: its own config, cache and data
// directories (nothing of the user's), the kubeconfig of the run, bounded in time.
import { join } from 'node:path'
import { parseAllDocuments } from 'yaml'
import { type Cluster, isObject, type Json, str } from '../harness/cluster.js'
import { run, type Run, scratch } from '../harness/processes.js'

const CLUSTER_SCOPED = new Set(['MutatingWebhookConfiguration', 'ValidatingWebhookConfiguration', 'CustomResourceDefinition', 'Namespace', 'ClusterRole', 'ClusterRoleBinding', 'PriorityClass'])

/** The REST path of an object as a manifest names it. */
export function objectPath (o: Json, defaultNamespace: string): string {
  const apiVersion = str(o, 'apiVersion') ?? ''
  const kind = str(o, 'kind') ?? ''
  const name = str(o, 'metadata', 'name') ?? ''
  const lower = kind.toLowerCase()
  const plural = lower.endsWith('y') ? `${lower.slice(0, -1)}ies` : `${lower}s`
  const base = apiVersion.includes('/') ? `/apis/${apiVersion}` : `/api/${apiVersion}`
  if (CLUSTER_SCOPED.has(kind)) return `${base}/${plural}/${name}`
  return `${base}/namespaces/${str(o, 'metadata', 'namespace') ?? defaultNamespace}/${plural}/${name}`
}

export function parseYamlDocs (text: string): Json[] {
  return parseAllDocuments(text).map(d => d.toJS() as unknown).filter(isObject)
}

export class Helm {
  private readonly home = scratch('helm-')
  constructor (readonly bin: string, private readonly cluster: Cluster) {}

  get homeDir (): string { return this.home }

  run (args: readonly string[], timeoutMs = 180_000): Promise<Run> {
    return run(this.bin, [...args, '--kubeconfig', this.cluster.kubeconfig], {
      timeoutMs,
      env: {
        PATH: process.env.PATH,
        HOME: this.home,
        HELM_CONFIG_HOME: join(this.home, 'config'),
        HELM_CACHE_HOME: join(this.home, 'cache'),
        HELM_DATA_HOME: join(this.home, 'data'),
      },
    })
  }

  /** helm install/upgrade that must succeed: throws with helm's message. */
  async must (args: readonly string[]): Promise<string> {
    const r = await this.run(args)
    if (r.code !== 0) throw new Error(`helm ${args.slice(0, 3).join(' ')}: exit ${r.code}: ${r.stderr.trim().slice(0, 800)}`)
    return r.stdout
  }

  async status (release: string, ns: string): Promise<string | undefined> {
    const r = await this.run(['status', release, '-n', ns, '-o', 'json'])
    if (r.code !== 0) return undefined
    return str(JSON.parse(r.stdout) as unknown, 'info', 'status')
  }

  async manifest (release: string, ns: string): Promise<Json[]> {
    return parseYamlDocs(await this.must(['get', 'manifest', release, '-n', ns]))
  }
}
