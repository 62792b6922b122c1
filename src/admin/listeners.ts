// Both listeners bound, or neither: a port that cannot be had is a
// configuration error naming its variable (exit 78), for both ports at once,
// so a second try does not stop at the next one.
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { ConfigError } from '../config/config-variables.js'

/** Where a listener binds, and the variable that sets its port (named when the port cannot be had). */
export interface ListenAt {
  readonly host: string
  readonly port: number
  /** Connections the kernel holds until they are accepted (Node's default 511; the kernel caps it at net.core.somaxconn). */
  readonly backlog?: number
}

/** Where both listeners of a process are bound, as the start line logs it. */
export interface BoundListeners {
  readonly address: AddressInfo
  readonly adminAddress: AddressInfo
  /** address, port and admin { address, port }: the start line's common fields. */
  readonly fields: { readonly address: string, readonly port: number, readonly admin: { readonly address: string, readonly port: number } }
}

/** What a failed bind means to the one who set the port, by Node's code. */
const WHY: Readonly<Record<string, string>> = {
  EADDRINUSE: 'is already in use (another process, or a second copy of this one)',
  EACCES: 'is not allowed for this user (ports below 1024 need privileges)',
  EADDRNOTAVAIL: 'is not an address of this host',
}

/** What is wrong with a port: `8080 on 127.0.0.1 is already in use (…) (EADDRINUSE)`; undefined for a failure that is not the port's. */
export function bindProblem (at: ListenAt, err: unknown): string | undefined {
  const code = (err as { code?: unknown }).code
  const why = typeof code === 'string' ? WHY[code] : undefined
  if (why === undefined) return undefined
  return `${String(at.port)} on ${at.host} ${why} (${code as string})`
}

/**
 * Binds the admin listener, then the main one, so probes answer before
 * traffic arrives; used by `serve` and `inject` alike. When either port cannot be had
 * (in use, privileged, not an address here), the other is closed again and a
 * ConfigError names every variable at fault, with the fix.
 */
export async function listenWithAdmin (app: FastifyInstance, listen: ListenAt, admin: FastifyInstance, adminListen: ListenAt, variables: { readonly listen: string, readonly admin: string }): Promise<BoundListeners> {
  const [adminBound] = await Promise.allSettled([admin.listen({ host: adminListen.host, port: adminListen.port })])
  const [appBound] = await Promise.allSettled([app.listen({ host: listen.host, port: listen.port, ...(listen.backlog === undefined ? {} : { backlog: listen.backlog }) })])
  if (adminBound.status === 'rejected' || appBound.status === 'rejected') {
    const problems: Array<{ variable: string, problem: string }> = []
    const unexplained: unknown[] = []
    for (const [bound, variable, at] of [[adminBound, variables.admin, adminListen], [appBound, variables.listen, listen]] as const) {
      if (bound.status === 'fulfilled') continue
      const problem = bindProblem(at, bound.reason)
      if (problem === undefined) unexplained.push(bound.reason)
      else problems.push({ variable, problem })
    }
    await Promise.allSettled([adminBound.status === 'fulfilled' ? admin.close() : undefined, appBound.status === 'fulfilled' ? app.close() : undefined])
    if (unexplained.length > 0) throw unexplained[0]
    // ConfigError's message is `${variable} ${problem}`: the first variable leads, the others follow as clauses.
    const [first = { variable: '', problem: '' }, ...rest] = problems
    throw new ConfigError(first.variable, `${first.problem}${rest.map(r => `; ${r.variable} ${r.problem}`).join('')}: set ${rest.length > 0 ? 'each' : 'it'} to a free port (0 picks one)`)
  }
  const address = app.server.address() as AddressInfo
  const adminAddress = admin.server.address() as AddressInfo
  return {
    address,
    adminAddress,
    fields: { address: address.address, port: address.port, admin: { address: adminAddress.address, port: adminAddress.port } },
  }
}
