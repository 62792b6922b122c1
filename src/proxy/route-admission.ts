// Step one and two of a proxied request, once routed: is it admitted on its
// route (no lookalike prefix, an allowed method, no override header asking
// for another, credentials loaded), and is its body within the limit.
import type { IncomingHttpHeaders } from 'node:http'
import { Readable, Transform, type TransformCallback } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { PROXY_METHODS, type Route } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { sendError } from './errors.js'
import { prefixLookalike } from '../client/guard.js'

/** The error code a body over COS_MAX_BODY_BYTES fails its stream with. */
export const BODY_TOO_LARGE = 'COS_BODY_TOO_LARGE'

type Hook = (request: FastifyRequest, reply: FastifyReply, done: () => void) => void

// Headers some frameworks and gateways honour to change the method (Express
// method-override, Symfony, ASP.NET, Google's and Azure's gateways, IIS URL
// Rewrite). They must not name a method the route refuses, nor, on a route
// with no list, one the proxy never forwards (TRACE would echo the token).
// They are refused rather than stripped: dropping one would run the request
// as another method than its sender meant (a POST instead of a DELETE).
const METHOD_OVERRIDES = ['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-method', 'x-original-http-method', 'x-rewrite-method', 'x-method'] as const
const NAMEABLE = /^[A-Za-z-]{1,24}$/

/** Why an override header asks for a method the route refuses, or undefined when none does. */
function overrideProblem (headers: IncomingHttpHeaders, allowed: readonly string[]): string | undefined {
  for (const name of METHOD_OVERRIDES) {
    const value = headers[name]
    if (value === undefined) continue
    const method = typeof value === 'string' ? value.trim().toUpperCase() : ''
    if (!allowed.includes(method)) {
      return `the ${name} header asks for ${NAMEABLE.test(method) ? method : 'another method'}, which is not allowed on this route`
    }
  }
  return undefined
}

/**
 * onRequest, so a refusal comes before any body is read. Callback style:
 * replying without calling done() ends the request here. One per route, in
 * that route's own scope: its name and methods come from here, not from
 * `request.routeOptions`, a getter that builds a new object on every read.
 */
export function admitToRoute (route: Route, routes: readonly Route[], credentials: CredentialStore): Hook {
  const prefixed = routes.filter(r => r.prefix !== '')
  const routeName = route.name
  const allowed = route.allowedMethods ?? PROXY_METHODS
  // Only the catch-all can get a path dressed up as a prefix: the router sends the real ones to their routes.
  const catchAll = routeName === 'api'
  return (request, reply, done) => {
    request.proxyRoute = routeName
    const imitated = catchAll ? prefixLookalike(request.url, prefixed) : undefined
    if (imitated !== undefined) {
      sendError(reply, 400, 'bad_request', `the path only looks like the ${imitated.prefix} prefix (case, ";", a trailing dot or space, encoding): send it as ${imitated.prefix}/…`)
      return
    }
    const problem = allowed.includes(request.method) ? overrideProblem(request.headers, allowed) : `${request.method} is not allowed on this route`
    if (problem !== undefined) {
      reply.header('allow', allowed.join(', '))
      sendError(reply, 405, 'method_not_allowed', problem)
      return
    }
    if (credentials.current === undefined) {
      sendError(reply, 503, 'credentials_unavailable', 'no valid access key pair is loaded yet')
      return
    }
    done()
  }
}

/** Passes a streamed body through and fails it once it exceeds the limit, which aborts the upstream request. */
class BodyLimit extends Transform {
  #left: number
  constructor (limit: number) {
    super()
    this.#left = limit
  }

  override _transform (chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.#left -= chunk.length
    if (this.#left < 0) callback(Object.assign(new Error('request body too large'), { code: BODY_TOO_LARGE }))
    else callback(null, chunk)
  }
}

/**
 * A preHandler (the body exists only after parsing), added only when there
 * is a limit: every hook costs every request.
 */
export function limitBodyTo (maxBody: number): Hook {
  return (request, _reply, done) => {
    if (request.body instanceof Readable) request.body = request.body.pipe(new BodyLimit(maxBody))
    done()
  }
}
