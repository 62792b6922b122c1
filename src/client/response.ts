// A response that cannot be written fails its own request, never the process;
// the JSON error shape every listener answers in.
import type { IncomingMessage, OutgoingHttpHeader, OutgoingHttpHeaders, ServerResponse as NodeServerResponse } from 'node:http'
import { createRequire } from 'node:module'
import type { FastifyReply, RawServerBase, RouteGenericInterface } from 'fastify'

// Required, not imported: an ES import of node:http reads every one of its
// exports, and three of them (WebSocket, CloseEvent, MessageEvent) load
// Node's own copy of undici, which the proxy never uses: 2 MB of idle RssAnon,
// 2.8 MB of RSS on Node 24 (docs/performance.md; "serve does not load Node's
// internal undici", test/bundle.test.ts).
// Node constructs it with the server's options too (highWaterMark,
// rejectNonStandardBodyWrites), which @types/node's constructor leaves out.
interface ServerResponseOptions { readonly highWaterMark?: number, readonly rejectNonStandardBodyWrites?: boolean }
const { ServerResponse } = createRequire(import.meta.url)('node:http') as {
  ServerResponse: typeof import('node:http').ServerResponse & (new <Request extends IncomingMessage>(req: Request, options?: ServerResponseOptions) => NodeServerResponse<Request>)
}

type HeadFields = OutgoingHttpHeaders | OutgoingHttpHeader[]

/** Any response with destroy(): Node's, or a Fastify reply's raw one. */
interface Response { destroy: () => unknown }
interface MaybeFailed { writeFailure?: Error }

/**
 * Ends `res` because writing it failed with `err`: its connection is closed
 * (a head that could not be written leaves nothing valid to send), and the
 * first error is kept for the request log (see responseFailure).
 */
export function failResponse (res: Response, err: Error): void {
  (res as Response & MaybeFailed).writeFailure ??= err
  // Without an error: one passed to destroy() would come back as a client error on the socket.
  res.destroy()
}

/** Why `res` could not be written, if it could not. */
export function responseFailure (res: Response): Error | undefined {
  return (res as Response & MaybeFailed).writeFailure
}

/**
 * The proxy's ServerResponse (Node's `ServerResponse` server option). Node's
 * writeHead throws when it refuses a head: a header value it will not write,
 * a status out of range, `Trailer` on a message that cannot carry trailers
 * (HEAD, HTTP/1.0, a Content-Length, a 204). It runs inside a body's pipe, a
 * stream's 'end' listener or undici's response callback (which rethrows on
 * purpose), where nothing catches it and the process dies with every request
 * in flight. Here the throw fails only this response (failResponse).
 */
export class GuardedResponse<Request extends IncomingMessage = IncomingMessage> extends ServerResponse<Request> {
  // Written out: the implicit one passes `...args` on, a spread per response
  // (~0.1 µs a response, measured on Node 24).
  // eslint-disable-next-line @typescript-eslint/no-useless-constructor -- see above
  constructor (req: Request, options?: ServerResponseOptions) {
    super(req, options)
  }

  override writeHead (statusCode: number, reason?: string | HeadFields, fields?: HeadFields): this {
    try {
      // Node reads a non-string `reason` as the fields (writeHead(status, fields)).
      return super.writeHead(statusCode, reason as string | undefined, fields)
    } catch (err) {
      failResponse(this, err as Error)
      return this
    }
  }
}

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
