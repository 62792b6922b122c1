// The part of autocannon 9's programmatic API the benchmark uses (autocannon
// ships no types; @types/autocannon describes v7). Result fields are those of
// lib/aggregateResult.js.
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events'

  namespace autocannon {
    interface Options {
      url: string
      connections?: number
      /** Seconds; ignored when `amount` is set. */
      duration?: number
      /** Stop after this many requests. */
      amount?: number
      /** Requests per second over all connections (sent in a burst at each 1 s tick, per connection). */
      overallRate?: number
      pipelining?: number
      method?: string
      body?: string | Buffer
      headers?: Record<string, string>
      timeout?: number
      /** Called with each client (autocannon's Client) before it connects. */
      setupClient?: (client: unknown) => void
    }

    interface Histogram {
      average: number
      mean: number
      min: number
      max: number
      total: number
      p50: number
      p99: number
    }

    interface Result {
      /** Seconds actually run. */
      duration: number
      errors: number
      timeouts: number
      non2xx: number
      mismatches: number
      resets: number
      requests: Histogram & { sent: number }
      throughput: Histogram
    }

    /** Emits 'response' (client, statusCode, resBytes, responseTimeMs) for every response. */
    interface Instance extends EventEmitter, PromiseLike<Result> {
      on: ((event: 'response', listener: (client: unknown, statusCode: number, resBytes: number, responseTimeMs: number) => void) => this)
        & ((event: string, listener: (...args: unknown[]) => void) => this)
    }
  }

  function autocannon (opts: autocannon.Options): autocannon.Instance
  export = autocannon
}
