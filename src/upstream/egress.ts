// Corporate egress: which forward proxy, if any, carries the connections to an
// upstream origin. The origins are fixed by configuration, so this is decided
// once per origin at start, never per request.
import { BlockList, isIP } from 'node:net'
import type { Egress, EgressProxy } from '../config/config-values.js'

export type { Egress, EgressProxy }

/** The proxy an upstream origin is reached through; undefined = directly. */
export function egressProxyFor (egress: Egress, origin: string): EgressProxy | undefined {
  const url = new URL(origin)
  const https = url.protocol === 'https:'
  const proxy = https ? egress.https : egress.http
  if (proxy === undefined) return undefined
  const port = url.port === '' ? (https ? 443 : 80) : Number(url.port)
  return bypassesProxy(egress.noProxy, url.hostname, port) ? undefined : proxy
}

/**
 * Whether NO_PROXY exempts host:port, matched as curl matches it: `*` is
 * every host; a name matches itself and its subdomains, with or without a
 * leading `.` or `*.`; an IP address or CIDR matches an upstream given as an
 * IP address (no name is resolved for it). As Go and undici, an entry may add
 * `:port` to match that port only. Anything else matches nothing.
 * `host` is as URL.hostname gives it: lowercase, an IPv6 address in brackets.
 */
export function bypassesProxy (noProxy: readonly string[], host: string, port: number): boolean {
  const name = (host.startsWith('[') ? host.slice(1, -1) : host).replace(/\.$/, '')
  const family = isIP(name)
  for (const entry of noProxy) {
    if (entry === '*') return true
    const { pattern, entryPort } = splitPort(entry)
    if (entryPort !== undefined && entryPort !== port) continue
    if (family === 0 ? domainMatches(pattern, name) : addressMatches(pattern, name, family)) return true
  }
  return false
}

function splitPort (entry: string): { pattern: string, entryPort?: number } {
  const bracketed = /^\[([^\]]+)\](?::(\d{1,5}))?$/.exec(entry)
  // One colon at most: a bare IPv6 address has several and no port.
  const m = bracketed ?? /^([^:]+):(\d{1,5})$/.exec(entry)
  if (m === null) return { pattern: entry }
  const [, pattern = '', port] = m
  return port === undefined ? { pattern } : { pattern, entryPort: Number(port) }
}

function domainMatches (pattern: string, name: string): boolean {
  const domain = pattern.replace(/^\*?\./, '').replace(/\.$/, '')
  return domain !== '' && (name === domain || name.endsWith(`.${domain}`))
}

function addressMatches (pattern: string, address: string, family: number): boolean {
  const [network = '', bits, extra] = pattern.split('/')
  const networkFamily = isIP(network)
  const max = networkFamily === 6 ? 128 : 32
  if (networkFamily !== family || extra !== undefined || (bits !== undefined && !/^\d{1,3}$/.test(bits))) return false
  const prefix = bits === undefined ? max : Number(bits)
  if (prefix > max) return false
  const list = new BlockList()
  const type = family === 6 ? 'ipv6' : 'ipv4'
  list.addSubnet(network, prefix, type)
  return list.check(address, type)
}
