// Attacks on what one connection may cost (issue 33), as a client sends
// them: requests pipelined and never read, bodies trickled a byte at a time,
// and the probe that must keep answering meanwhile. Shared by
// test/security/per-connection.test.ts and memory-cgroup.test.ts.
import { get as httpGet } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { connect as tlsConnect } from 'node:tls'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { scaled } from './time-scale.js'

/**
 * The status, or the error's code when there was no answer in time: on a new
 * connection each time, as the kubelet probes (its HTTP probes keep no
 * connection alive). A pooled keep-alive connection would race the server
 * closing it as idle, which the attacks make it do, and fail as a client
 * error that says nothing about whether the server answers.
 */
export async function statusOf (url: string): Promise<number | string> {
  return await new Promise<number | string>(resolve => {
    const req = httpGet(url, { agent: false, timeout: scaled(3000) }, res => {
      res.resume()
      res.on('end', () => { resolve(res.statusCode ?? 'no status') })
      res.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? err.name) })
    })
    req.on('timeout', () => { req.destroy(Object.assign(new Error('no answer in time'), { code: 'TIMEOUT' })) })
    req.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? err.name) })
  })
}

export interface Attacker { readonly socket: Socket, readonly closed: Promise<void> }

/** Writes `data` in one write on each of `count` connections, then reads nothing until drain() is called. */
export async function pipelineUnread (port: number, data: string, count: number): Promise<Attacker[]> {
  return Promise.all(Array.from({ length: count }, () => new Promise<Attacker>(resolve => {
    const socket = connect({ host: '127.0.0.1', port })
    socket.on('error', () => { /* reset by the proxy: counted as closed */ })
    const closed = new Promise<void>(resolve => socket.once('close', () => { resolve() }))
    socket.once('connect', () => {
      socket.pause()
      socket.write(data)
      resolve({ socket, closed })
    })
  })))
}

/** Reads what the proxy sent the attacker until it closes (or `ms` pass): the statuses of the answers. */
export async function drain (attacker: Attacker, ms = 10_000): Promise<{ statuses: number[], closed: boolean }> {
  let text = ''
  attacker.socket.setEncoding('latin1')
  attacker.socket.on('data', (d: string) => { text += d })
  attacker.socket.resume()
  const closed = await Promise.race([attacker.closed.then(() => true), sleep(scaled(ms)).then(() => false)])
  attacker.socket.destroy()
  return { statuses: [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map(m => Number(m[1])), closed }
}

/** `tries` probes of `url`, `gapMs` apart: the statuses. */
export async function probe (url: string, tries: number, gapMs: number): Promise<(number | string)[]> {
  const statuses: (number | string)[] = []
  for (let i = 0; i < tries; i++) {
    statuses.push(await statusOf(url))
    await sleep(gapMs)
  }
  return statuses
}

export function alive (child: { exitCode: number | null, signalCode: NodeJS.Signals | null }): boolean {
  return child.exitCode === null && child.signalCode === null
}

/** Keeps `count` connections each sending `head` and then its body one byte every `gapMs`, reconnecting when closed, until stopped. */
export function trickleBodies (port: number, head: string, count: number, gapMs: number): Trickle {
  let stopped = false
  let connections = 0
  const sockets = new Set<Socket>()
  const open = (): void => {
    if (stopped) return
    connections++
    const socket = connect({ host: '127.0.0.1', port })
    sockets.add(socket)
    let timer: NodeJS.Timeout | undefined
    socket.on('error', () => { /* closed by the proxy */ })
    socket.once('connect', () => {
      socket.write(head)
      timer = setInterval(() => { socket.write('x') }, gapMs)
    })
    socket.once('close', () => {
      clearInterval(timer)
      sockets.delete(socket)
      setTimeout(open, 20)
    })
  }
  for (let i = 0; i < count; i++) open()
  return { stop: () => { stopped = true; for (const socket of sockets) socket.destroy() }, connections: () => connections }
}


export interface Trickle {
  readonly stop: () => void
  /** Connections opened so far. */
  readonly connections: () => number
  /** Connections that sent all they were to send (unfinishedUploads); an attack that never got that far proved nothing. */
  readonly delivered?: () => number
}

/**
 * Keeps `count` TLS connections each sending `head` and all of a body of
 * `declared` bytes but the last `withheld`, then waiting, reconnecting when
 * closed, until stopped: unfinished uploads that hold whatever the server
 * keeps of them.
 */
export function unfinishedUploads (port: number, ca: string, path: string, declared: number, withheld: number, count: number): Trickle {
  let stopped = false
  let connections = 0
  let delivered = 0
  const sockets = new Set<Socket>()
  const chunk = Buffer.alloc(64 * 1024, 0x20)
  const open = (): void => {
    if (stopped) return
    connections++
    const socket = tlsConnect({ host: '127.0.0.1', port, ca })
    sockets.add(socket)
    socket.on('error', () => { /* closed by the server */ })
    socket.once('secureConnect', () => {
      socket.write(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${String(declared)}\r\n\r\n`)
      let left = declared - withheld
      const more = (): void => {
        while (left > 0 && !socket.destroyed) {
          const n = Math.min(left, chunk.length)
          left -= n
          if (!socket.write(chunk.subarray(0, n))) { socket.once('drain', more); return }
        }
        if (left === 0 && !socket.destroyed) socket.write('', () => { delivered++ })
      }
      more()
    })
    socket.once('close', () => {
      sockets.delete(socket)
      setTimeout(open, 20)
    })
  }
  for (let i = 0; i < count; i++) open()
  return { stop: () => { stopped = true; for (const socket of sockets) socket.destroy() }, connections: () => connections, delivered: () => delivered }
}

/** The environment `inject` needs, serving `pki`'s pair (tls-fixtures.ts), on ephemeral ports. */
export function injectEnv (pkiDir: string): Record<string, string> {
  return {
    COS_INJECT_HOST: '127.0.0.1',
    COS_INJECT_PORT: '0',
    COS_INJECT_TLS_CERT_FILE: join(pkiDir, 'server.pem'),
    COS_INJECT_TLS_KEY_FILE: join(pkiDir, 'server.key'),
    // The definition shipped for deployments without the chart (scripts/render-injector-fixture.sh).
    COS_INJECT_SIDECAR_FILE: fileURLToPath(new URL('../../examples/injector/sidecar.json', import.meta.url)),
    COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
    COS_MANAGEMENT_API_URL: 'https://management.cos.example.com/api',
  }
}

/** Matches `inject`'s listening line: the webhook's port, then the admin port. */
export const INJECT_LISTENING = /"port":(\d+),"admin":\{"address":"[^"]+","port":(\d+)\}.*injection webhook listening/

/** Containers of a pod whose patch is just under the webhook's bound of one answer (128 KiB, ~800 containers): the largest answer a client can make it write (webhook-answers.test.ts holds that it is injected). */
export const NEAR_BOUND = 700

/**
 * An AdmissionReview (as `inject` gets it) of a pod asking for injection with
 * `containers` containers of one letter's name and no image: the patch grows
 * with every one (issue 43: 99,000 in 1.77 MB got a 15.3 MB answer).
 * `annotations` are added to the inject one.
 */
export function manyContainersReview (containers: number, annotations: Record<string, string> = {}): string {
  const list = Array.from({ length: containers }, (_, i) => ({ name: `c${i.toString(36)}` }))
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: 'b7d0a6d4-43a1-4c1e-9b1e-000000000043',
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'apps',
      operation: 'CREATE',
      object: { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'many', annotations: { 'cos-auth-proxy.io/inject': 'true', ...annotations } }, spec: { containers: list } },
      dryRun: false,
    },
  })
}

/**
 * `count` TLS connections, each posting `body` to `path` `times` times
 * (pipelined when more than once) and reading nothing until drain(): answers
 * a client never reads, which the server holds until it closes them.
 */
export async function postUnread (port: number, ca: string, path: string, body: string, count: number, times = 1): Promise<Attacker[]> {
  const request = `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${String(Buffer.byteLength(body))}\r\n\r\n${body}`
  return Promise.all(Array.from({ length: count }, () => new Promise<Attacker>(resolve => {
    const socket = tlsConnect({ host: '127.0.0.1', port, ca })
    socket.on('error', () => { /* closed by the server: counted as closed */ })
    const closed = new Promise<void>(resolve => socket.once('close', () => { resolve() }))
    socket.once('secureConnect', () => {
      socket.pause()
      socket.write(request.repeat(times))
      resolve({ socket, closed })
    })
    // Refused before the handshake ends (a cap): resolved all the same, closed.
    socket.once('close', () => { resolve({ socket, closed }) })
  })))
}

/** One POST of `body` over TLS on its own connection, read whole: the status and the body (an error's name when none came in time). */
export function postOnce (port: number, ca: string, path: string, body: string): Promise<{ status: number | string, body: string }> {
  return new Promise(resolve => {
    const req = httpsRequest({ host: '127.0.0.1', port, path, method: 'POST', ca, agent: false, headers: { 'content-type': 'application/json' }, timeout: scaled(20_000) }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { text += d })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, body: text }) })
    })
    req.on('error', err => { resolve({ status: err.name, body: '' }) })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.end(body)
  })
}
