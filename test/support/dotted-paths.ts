// Targets for the dotted-name tests, of the proxy in-process
// (dotted-names.test.ts) and of the bundle that ships (bundle.test.ts), both
// with COS_OPTIMIZE_API_URL=<upstream>/opt/v1 and COS_API_URL=<upstream>.

/** Segments that only contain dots: [target, what the upstream must get]. */
export const DOTTED_NAMES: readonly (readonly [target: string, forwarded: string])[] = [
  ['/optimize/a..b/..x/.../x.', '/opt/v1/a..b/..x/.../x.'],
  ['/optimize/x../y', '/opt/v1/x../y'],
  ['/optimize/..x', '/opt/v1/..x'],
  ['/optimize/...', '/opt/v1/...'],
  ['/optimize/a..', '/opt/v1/a..'],
  ['/optimize/.well-known/openid-configuration', '/opt/v1/.well-known/openid-configuration'],
  ['/optimize/.hidden/..../v1.2..3?q=../..&r=..', '/opt/v1/.hidden/..../v1.2..3?q=../..&r=..'],
  ['/optimize/.%2E./x', '/opt/v1/.%2E./x'],
  ['/optimize/%2e%2e%2ex', '/opt/v1/%2e%2e%2ex'],
  ['/x../..y/...', '/x../..y/...'],
]

/** Real dot-segments, raw or encoded: the guard refuses each with 400 "dot-segment in path". */
export const DOT_SEGMENTS: readonly string[] = ['/optimize/a/../b', '/optimize/..', '/optimize/./x', '/optimize/%2e%2e/x', '/optimize/.%2E/x', '/optimize/%2E/x', '/x/..', '/..']
