import type { FastifyReply } from 'fastify'

export interface ErrorBody {
  readonly error: { readonly code: string, readonly message: string }
}

/** Every error the proxy itself produces has this shape and carries x-request-id. */
export function sendError (reply: FastifyReply, status: number, code: string, message: string): FastifyReply {
  return reply
    .code(status)
    .header('content-type', 'application/json; charset=utf-8')
    .header('x-request-id', reply.request.id)
    .send(JSON.stringify({ error: { code, message } } satisfies ErrorBody))
}
