// Step four: whether a failed or refused attempt is tried once more, with a
// freshly minted token, and only when that cannot duplicate what the
// upstream did.
import type { IncomingHttpHeaders } from 'node:http'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import type { RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { errorCodes } from '../upstream/error-codes.js'

interface AttemptRequest { method: string, headers: IncomingHttpHeaders, body: unknown }
interface AttemptResponse { statusCode: number, stream: { resume: () => void } }

const RETRY_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
// Failures where the upstream cannot have acted on the request.
const CONNECTION_FAILURES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'])

function isBodyless (req: AttemptRequest): boolean {
  const length = req.headers['content-length']
  return (req.body === '' || req.body === undefined) && req.headers['transfer-encoding'] === undefined && (length === undefined || length === '0')
}

export interface RetryOptions {
  readonly credentials: CredentialStore
  readonly observer?: {
    readonly retried: (route: RouteName, reason: 'connect' | 'unauthorized') => void
    readonly tokenMinted: () => void
  } | undefined
  /** Asks for the credential files to be re-read in the background (an upstream 401). */
  readonly resyncCredentials?: (() => void) | undefined
}

/**
 * reply-from calls this after every attempt with its internal request
 * options (`req`) and response (`res`), whatever its typings say. One more
 * attempt, with a freshly minted token, only when it is safe:
 *  - the request has no body, its method is idempotent and the connection
 *    failed before anything was answered (refused, reset, closed);
 *  - the upstream answered 401 to a request without a body that was
 *    signed with a pair no longer in force (the watcher applied a rotation
 *    while the request was in flight).
 * Timeouts and upstream 5xx are never retried.
 *
 * The hook must answer at once, and a retry it schedules cannot be called
 * off, so the files cannot be re-read for the request at hand: any other
 * 401 asks for a background re-read, for the requests that follow (and for
 * those in flight, whose 401 then finds the new pair in force).
 */
export function retryPolicy ({ credentials, observer, resyncCredentials }: RetryOptions): (route: RouteName) => NonNullable<FastifyReplyFromHooks['retryDelay']> {
  return route => ({ err, req, res, attempt }) => {
    if (attempt > 0) return null
    const attemptReq = req as unknown as AttemptRequest
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition -- undefined on a response, whatever the typings say
    if (err != null) {
      if (!isBodyless(attemptReq) || !RETRY_METHODS.has(attemptReq.method) || !CONNECTION_FAILURES.has(errorCodes(err).next().value ?? '')) return null
      observer?.retried(route, 'connect')
    } else {
      const attemptRes = res as unknown as AttemptResponse | undefined
      if (attemptRes?.statusCode !== 401) return null
      if (credentials.current?.signed(attemptReq.headers.authorization ?? '') !== false) {
        resyncCredentials?.()
        return null
      }
      if (!isBodyless(attemptReq)) return null
      attemptRes.stream.resume() // drain the 401 so its connection is reused
      observer?.retried(route, 'unauthorized')
    }
    attemptReq.headers.authorization = credentials.current?.next()
    observer?.tokenMinted()
    return 1 // ms; 0 would read as "do not retry"
  }
}
