// Names that configuration and requests are both read with, so a configured
// value and what a client sends are compared the same way: a Host value as a
// browser reads it, and a path prefix folded as lenient servers compare it.
// Pure, no I/O; the checks that use them are in src/client/.

// A Host value as a browser sends it: a name or an IPv4 address, or an IPv6
// address in brackets, then an optional port. Userinfo, paths, spaces and
// percent-escapes are not, and are never read as loopback.
const HOST_VALUE = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::[0-9]{0,5})?$/

/**
 * The name in a Host header value, read as a browser reads the host of a URL
 * (the WHATWG URL parser): lower case, without port or trailing dot, IPv4 in
 * dotted decimal (`127.1` and `0x7f.1` are `127.0.0.1`), IPv6 compressed and
 * in brackets. Undefined when the value is not `host[:port]`.
 */
export function hostName (value: string): string | undefined {
  if (!HOST_VALUE.test(value)) return undefined
  let name: string
  try {
    name = new URL(`http://${value}/`).hostname
  } catch {
    return undefined
  }
  return name.endsWith('.') ? name.slice(0, -1) : name
}

export function withoutParams (segment: string): string {
  const semicolon = segment.indexOf(';')
  return semicolon < 0 ? segment : segment.slice(0, semicolon)
}

// Surrounding whitespace, and trailing dots (Windows and IIS drop them: `a.` is `a`).
const UNTRIMMED = /^\s+|[\s.]+$/g

/**
 * A path segment as lenient servers compare it: without `;params` (Tomcat,
 * Jetty, Spring), case folded (IIS, ASP.NET routing, case-insensitive
 * routers; through upper case, as Java's equalsIgnoreCase, so the dotless
 * `ı` is `i`), without surrounding whitespace or trailing dots (Windows).
 * The caller has already decoded and NFKC-normalised it (fullwidth `ｍ` is
 * `m`, the Kelvin sign is `K`).
 */
export function foldSegment (segment: string): string {
  return withoutParams(segment).toUpperCase().toLowerCase().replace(UNTRIMMED, '')
}

/** A configured prefix as folded segments: `/Mgmt/v1` → ['mgmt', 'v1']. */
export function foldedPrefix (prefix: string): string[] {
  return prefix.split('/').map(foldSegment).filter(s => s !== '')
}
