import type { FastifyReply, RawServerBase, RouteGenericInterface } from 'fastify'

// Any server flavour (the proxy's, the admin listener's, the webhook's HTTPS one).
type AnyReply = FastifyReply<RouteGenericInterface, RawServerBase>

export interface ErrorBody {
  readonly error: { readonly code: string, readonly message: string }
}

/** Every error the proxy itself produces has this shape and carries x-request-id. */
export function sendError (reply: AnyReply, status: number, code: string, message: string): AnyReply {
  return reply
    .code(status)
    .header('content-type', 'application/json; charset=utf-8')
    .header('x-request-id', reply.request.id)
    .send(JSON.stringify({ error: { code, message } } satisfies ErrorBody))
}
