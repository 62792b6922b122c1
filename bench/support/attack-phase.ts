// The last phase of `npm run bench:soak`: the attacks on what one connection may cost
// (docs/security.md, issue 33) all at once against the soaked proxy, as a client on loopback
// sends them, with the kubelet's probe of /healthz running throughout:
//   1,500 GET /metrics pipelined on one admin connection, never read;
//   64 connections trickling request bodies to the admin port, a byte every 500 ms;
//   1,000 connections pipelining 4 GETs each to the proxy port, never read.
// Attack code shared with the security tests (test/support/attacks.ts).
import { setTimeout as sleep } from 'node:timers/promises'
import { pipelineUnread, probe, trickleBodies, type Attacker } from '../../test/support/attacks.js'
import { SMALL_PATH } from './load.js'

export interface AttackResult {
  readonly seconds: number
  /** /healthz statuses, one a second. */
  readonly probes: ReadonlyArray<number | string>
  /** Connections the trickle opened (reconnecting when closed). */
  readonly trickled: number
}

const GET = (path: string): string => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`

export async function attackPhase (proxyPort: number, adminPort: number, seconds: number): Promise<AttackResult> {
  const t0 = performance.now()
  const attackers: Attacker[] = []
  // 1,000 bytes declared (what /quitquitquit accepts), one sent every 500 ms: cut by the admin
  // port's 5 s request timeout long before it is whole, then sent again.
  const trickle = trickleBodies(adminPort, 'POST /quitquitquit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n', 64, 500)
  try {
    attackers.push(...await pipelineUnread(adminPort, GET('/metrics').repeat(1500), 1))
    for (let i = 0; i < 1000; i += 100) {
      attackers.push(...await pipelineUnread(proxyPort, GET(SMALL_PATH).repeat(4), 100))
      await sleep(10)
    }
    const probes = await probe(`http://127.0.0.1:${adminPort}/healthz`, seconds, 1000)
    return { seconds: (performance.now() - t0) / 1000, probes, trickled: trickle.connections() }
  } finally {
    trickle.stop()
    for (const a of attackers) a.socket.destroy()
  }
}
