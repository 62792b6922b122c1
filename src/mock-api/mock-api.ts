// A local stand-in for the COS Management and Optimize APIs. It verifies every
// token as strictly as a real server would (signature, clock skew, replay), so
// the demo, the container smoke test and the proxy's end-to-end tests fail
// loudly when the signer is wrong. The sample data is made up.
import { createHash, type KeyObject } from 'node:crypto'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import { verifyToken, wallClockNs, type VerifyFailure } from '../token/token.js'

export interface MockApiOptions {
  readonly accessKey: string
  /** From secretKey(secret) in token.ts. */
  readonly key: KeyObject
  /** Accepted clock difference either way; default 300_000 (±5 min). */
  readonly maxSkewMs?: number
  readonly logger?: FastifyBaseLogger | boolean
  /** ns since the epoch; for tests. Default: wall clock. Tokens are checked against it and every answer's Date header shows it. */
  readonly now?: () => bigint
  /** Most nonces remembered at once; default 100_000. Small values are for tests. */
  readonly maxNonces?: number
}

type AuthErrorCode =
  | 'missing_token' | 'malformed_token' | 'wrong_key' | 'bad_signature' | 'stale_timestamp' | 'replayed_nonce'

const VERIFY_CODES: Readonly<Record<VerifyFailure, AuthErrorCode>> = {
  malformed: 'malformed_token',
  wrong_key: 'wrong_key',
  bad_signature: 'bad_signature',
  stale: 'stale_timestamp',
}

const DEFAULT_MAX_SKEW_MS = 300_000
const DEFAULT_MAX_NONCES = 100_000
const SCHEME = 'Bearer '
// Both token forms are visible ASCII. Anything else (a space, a second
// "Bearer ") is rejected here, because parseToken itself tolerates a leading "Bearer ".
const VISIBLE_ASCII = /^[\x21-\x7e]+$/

/**
 * Nonces of accepted tokens, each kept until its token's timestamp falls out
 * of the skew window (after that the token is stale anyway). Kept in
 * acceptance order, so the sweep from the front is cheap; an expired entry
 * stuck behind a live one is at most 2 × skew old, and the size cap bounds
 * memory under any request rate. Evicting a live nonce at the cap reopens a
 * replay for it: the price of bounded memory.
 */
class NonceCache {
  readonly #expiresNs = new Map<string, bigint>()
  readonly #max: number

  constructor (max: number) {
    this.#max = max
  }

  /** Records the nonce; false if it is already held and still live. */
  add (nonce: string, expiresNs: bigint, nowNs: bigint): boolean {
    for (const [n, exp] of this.#expiresNs) {
      if (exp >= nowNs) break
      this.#expiresNs.delete(n)
    }
    const held = this.#expiresNs.get(nonce)
    if (held !== undefined) {
      if (held >= nowNs) return false
      this.#expiresNs.delete(nonce)
    }
    if (this.#expiresNs.size >= this.#max) {
      const oldest = this.#expiresNs.keys().next()
      if (oldest.done !== true) this.#expiresNs.delete(oldest.value)
    }
    this.#expiresNs.set(nonce, expiresNs)
    return true
  }
}

interface AuthFailure { readonly code: AuthErrorCode, readonly message: string }

/** IMF-fixdate (RFC 9110 §5.6.7), whole seconds. */
function httpDate (ns: bigint): string {
  return new Date(Number(ns / 1_000_000n)).toUTCString()
}

function errorBody (code: string, message: string): { error: { code: string, message: string } } {
  return { error: { code, message } }
}

interface TokenCheck {
  /** The clock the check and the Date header read. */
  readonly now: () => bigint
  readonly authenticate: (header: string | undefined) => AuthFailure | undefined
}

/** The mock's token check, with its replay cache; TypeError for options out of range. */
function tokenCheck (opts: MockApiOptions): TokenCheck {
  const maxSkewMs = opts.maxSkewMs ?? DEFAULT_MAX_SKEW_MS
  const maxNonces = opts.maxNonces ?? DEFAULT_MAX_NONCES
  if (opts.accessKey === '') throw new TypeError('accessKey must not be empty')
  if (!Number.isSafeInteger(maxSkewMs) || maxSkewMs < 0) throw new TypeError('maxSkewMs must be a non-negative integer')
  if (!Number.isSafeInteger(maxNonces) || maxNonces < 1) throw new TypeError('maxNonces must be a positive integer')
  const maxSkewNs = BigInt(maxSkewMs) * 1_000_000n
  const now = opts.now ?? wallClockNs
  const nonces = new NonceCache(maxNonces)

  // Messages are fixed text or describe only what the client sent; none is
  // derived from the secret or the expected signature.
  function authenticate (header: string | undefined): AuthFailure | undefined {
    if (header?.startsWith(SCHEME) !== true || header.length === SCHEME.length) {
      return { code: 'missing_token', message: 'expected an Authorization: Bearer <token> header' }
    }
    const token = header.slice(SCHEME.length)
    if (!VISIBLE_ASCII.test(token)) {
      return { code: 'malformed_token', message: 'malformed token: unexpected characters' }
    }
    const nowNs = now()
    const result = verifyToken(token, { accessKey: opts.accessKey, key: opts.key, maxSkewNs, nowNs })
    if (!result.ok) return { code: VERIFY_CODES[result.code], message: result.reason }
    // Recorded only now, after the signature verified, so forged tokens cannot fill the cache.
    const { nonce, timestamp } = result.fields
    if (!nonces.add(nonce, BigInt(timestamp) + maxSkewNs, nowNs)) {
      return { code: 'replayed_nonce', message: 'nonce was already used within the replay window' }
    }
    return undefined
  }
  return { now, authenticate }
}

export function buildMockApi (opts: MockApiOptions): FastifyInstance {
  const { now, authenticate } = tokenCheck(opts)

  /** True when the request may go on; otherwise it has been answered 401. */
  function admit (request: FastifyRequest, reply: FastifyReply): boolean {
    // A server's Date and its token check read one clock: an upstream whose
    // clock is off shows it in every answer, refusals included.
    reply.header('date', httpDate(now()))
    const failure = authenticate(request.headers.authorization)
    if (failure === undefined) return true
    request.log.info({ authError: failure.code }, 'request rejected')
    void reply.code(401).header('www-authenticate', 'Bearer').send(errorBody(failure.code, failure.message))
    return false
  }

  // A URL the router cannot decode is refused before any hook runs; the
  // token is still checked first, so an unauthenticated caller only ever sees 401.
  function frameworkErrors (error: Error, request: FastifyRequest, reply: FastifyReply): void {
    if (admit(request, reply)) void reply.code(400).send(errorBody('bad_request', error.message))
  }
  const app = opts.logger === undefined || typeof opts.logger === 'boolean'
    ? Fastify({ logger: opts.logger ?? false, frameworkErrors })
    : Fastify({ loggerInstance: opts.logger, frameworkErrors })

  app.addHook('onRequest', (request, reply, done) => {
    if (admit(request, reply)) done()
  })

  // Bodies reach handlers as the raw stream: only /echo reads them, by hashing
  // as they arrive, so size is never a memory question.
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_request, payload, done) => { done(null, payload) })

  registerSampleRoutes(app)
  return app
}

/** The sample routes, /echo, and the JSON error shape for everything else. */
function registerSampleRoutes (app: FastifyInstance): void {
  app.setNotFoundHandler((request, reply) => {
    const path = (request.raw.url ?? '').split('?', 1)[0] ?? ''
    return reply.code(404).send(errorBody('not_found', `no route for ${request.method} ${path}`))
  })

  app.setErrorHandler((error: Error & { statusCode?: number }, request, reply) => {
    const status = error.statusCode !== undefined && error.statusCode >= 400 ? error.statusCode : 500
    if (status < 500) return reply.code(status).send(errorBody('bad_request', error.message))
    request.log.error({ err: error }, 'request failed')
    return reply.code(status).send(errorBody('internal_error', 'internal error'))
  })

  app.get('/management/v1/notification-rules', () => ({ items: NOTIFICATION_RULES, nextPageToken: null }))
  app.get('/management/v1/clusters', () => ({ items: CLUSTERS, nextPageToken: null }))
  app.get('/optimize/v1/workloads/recommendations', () => ({ items: RECOMMENDATIONS, nextPageToken: null }))
  app.all('/echo', echo)
  app.all('/echo/*', echo)
}

interface EchoDocument {
  readonly method: string
  readonly url: string
  readonly headers: Record<string, string | string[] | undefined>
  readonly bodyBytes?: number
  readonly bodySha256?: string
}

async function echo (request: FastifyRequest): Promise<EchoDocument> {
  const headers = { ...request.headers }
  delete headers.authorization
  const doc = { method: request.method, url: request.raw.url ?? request.url, headers }
  if (!(request.body instanceof Readable)) return doc
  const hash = createHash('sha256')
  let bodyBytes = 0
  await pipeline(request.body, async (source: AsyncIterable<Buffer>) => {
    for await (const chunk of source) {
      bodyBytes += chunk.length
      hash.update(chunk)
    }
  })
  return { ...doc, bodyBytes, bodySha256: hash.digest('hex') }
}

const NOTIFICATION_RULES = [
  {
    id: 'nr-7f3a1c',
    name: 'Node group over-provisioned',
    enabled: true,
    severity: 'warning',
    trigger: { kind: 'recommendation', resource: 'node-group', minMonthlySavingsUsd: 50 },
    channelIds: ['nc-slack-platform'],
    createdAt: '2024-11-04T09:12:33Z',
  },
  {
    id: 'nr-2b9e40',
    name: 'Cluster agent disconnected',
    enabled: true,
    severity: 'critical',
    trigger: { kind: 'cluster-status', status: 'disconnected', forMinutes: 10 },
    channelIds: ['nc-pagerduty-oncall', 'nc-email-sre'],
    createdAt: '2024-12-18T16:40:02Z',
  },
]

const CLUSTERS = [
  {
    id: 'cl-prod-eu-1',
    name: 'prod-eu-west-1',
    provider: 'aws',
    region: 'eu-west-1',
    kubernetesVersion: '1.30.4',
    status: 'connected',
    nodeCount: 42,
  },
  {
    id: 'cl-stg-us-2',
    name: 'staging-us-east-2',
    provider: 'gcp',
    region: 'us-east4',
    kubernetesVersion: '1.29.8',
    status: 'connected',
    nodeCount: 9,
  },
]

const RECOMMENDATIONS = [
  {
    clusterId: 'cl-prod-eu-1',
    namespace: 'checkout',
    workload: { kind: 'Deployment', name: 'payment-api' },
    container: 'app',
    current: { cpuRequest: '2', memoryRequest: '4Gi' },
    recommended: { cpuRequest: '750m', memoryRequest: '1536Mi' },
    estimatedMonthlySavingsUsd: 61.2,
  },
  {
    clusterId: 'cl-stg-us-2',
    namespace: 'search',
    workload: { kind: 'StatefulSet', name: 'indexer' },
    container: 'indexer',
    current: { cpuRequest: '500m', memoryRequest: '1Gi' },
    recommended: { cpuRequest: '1', memoryRequest: '2Gi' },
    estimatedMonthlySavingsUsd: -18.4,
  },
]
