// When the certificates of a mounted PEM file expire: the earliest notAfter
// among them, in seconds since the epoch (what the expiry gauges export, as
// cert-manager's certmanager_certificate_expiration_timestamp_seconds does).
// Computed when a file's new content is put in force, never per request; a
// content refused by its consumer keeps the value of the one still in use.
import { X509Certificate } from 'node:crypto'

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g

/**
 * The earliest notAfter (Unix seconds) of the certificates in `pem`: a leaf
 * and its chain, or a CA bundle (the first to expire is the one to renew).
 * Undefined when it holds none that parses: no series, rather than a value
 * that means nothing.
 */
export function earliestNotAfter (pem: string): number | undefined {
  let earliest: number | undefined
  for (const [block] of pem.matchAll(PEM_CERTIFICATE)) {
    let ms: number
    try {
      // validTo ("Dec  2 07:58:04 2026 GMT") is in every Node 22; validToDate only from 22.10.
      ms = Date.parse(new X509Certificate(block).validTo)
    } catch {
      continue
    }
    if (Number.isFinite(ms) && (earliest === undefined || ms / 1000 < earliest)) earliest = ms / 1000
  }
  return earliest
}
