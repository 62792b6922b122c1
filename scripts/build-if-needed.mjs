// Builds the bundle (dist/cos-auth-proxy.mjs) when it is missing or older
// than any file in src/ or the bundle script, so that `npm start` and
// `npm run demo` work straight after `npm ci`.
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'

const root = new URL('..', import.meta.url).pathname
const newest = (dir) => {
  let t = 0
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name)
    t = Math.max(t, e.isDirectory() ? newest(p) : statSync(p).mtimeMs)
  }
  return t
}
const bundleScript = join(root, 'scripts', 'bundle.mjs')
const bundle = join(root, 'dist', 'cos-auth-proxy.mjs')
if (!existsSync(bundle) || statSync(bundle).mtimeMs < Math.max(newest(join(root, 'src')), statSync(bundleScript).mtimeMs)) {
  execFileSync(process.execPath, [bundleScript], { stdio: 'inherit' })
}
