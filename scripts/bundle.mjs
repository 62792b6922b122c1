// Builds what ships: dist/cos-auth-proxy.mjs, one minified ESM file holding
// src/ and every production dependency it runs, with its source map and the
// licence notices of the packages inside it. The image runs this file and
// nothing else (no node_modules); so do `npm start` and the CLI tests.
//
// usage: node scripts/bundle.mjs        (npm run build runs it after tsc)
//
// Subcommands import what they need with import(): without code splitting,
// esbuild keeps those modules in this one file but evaluates them only when
// the import() runs, so `token` never starts fastify or undici, and `serve`
// never runs mock-api's code (README, "Development").
import { build } from 'esbuild'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join, relative, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
export const BUNDLE = join(root, 'dist', 'cos-auth-proxy.mjs')
const NOTICES = join(root, 'dist', 'cos-auth-proxy.licenses.txt')
const BUILD_URL = join(root, 'src', 'reply-from-build-url.ts')

/**
 * src/reply-from-build-url.ts's buildURL, put into reply-from's lib/utils.js
 * at build time: the bundle has no node_modules and no require cache for
 * src/reply-from-patch.ts to patch at run time, so that module is left out.
 */
function replyFromBuildUrl () {
  let patched = 0
  return {
    name: 'reply-from-build-url',
    setup (b) {
      b.onResolve({ filter: /\/reply-from-patch\.js$/ }, () => ({ path: 'reply-from-patch', namespace: 'patched-at-build-time' }))
      b.onLoad({ filter: /.*/, namespace: 'patched-at-build-time' }, () => ({ contents: '', loader: 'js' }))
      b.onLoad({ filter: /[\\/]@fastify[\\/]reply-from[\\/]lib[\\/]utils\.js$/ }, args => {
        const wanted = /PATCHED_REPLY_FROM = '([^']+)'/.exec(readFileSync(BUILD_URL, 'utf8'))?.[1]
        const { version } = JSON.parse(readFileSync(join(dirname(args.path), '..', 'package.json'), 'utf8'))
        if (version !== wanted) throw new Error(`@fastify/reply-from is ${version}; src/reply-from-build-url.ts replaces the buildURL of ${wanted}`)
        patched++
        const source = readFileSync(args.path, 'utf8')
        return { contents: `${source}\nmodule.exports.buildURL = require(${JSON.stringify(BUILD_URL)}).buildURL\n`, loader: 'js' }
      })
      b.onEnd(result => {
        if (result.errors.length === 0 && patched !== 1) throw new Error(`reply-from's lib/utils.js was patched ${patched} times, not once`)
      })
    },
  }
}

/** The package.json of the package a bundled file belongs to. */
function packageOf (file) {
  for (let dir = dirname(file); dir.includes(`node_modules${sep}`); dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
      if (typeof pkg.name === 'string' && dir.endsWith(pkg.name.split('/').join(sep))) return { dir, pkg }
    }
  }
  return undefined
}

/** Each bundled package's name, version, licence and licence text: MIT and the like ask for it to travel with the code. */
function notices (inputs) {
  const packages = new Map()
  for (const input of Object.keys(inputs)) {
    const found = packageOf(join(root, input))
    if (found !== undefined) packages.set(`${found.pkg.name}@${found.pkg.version}`, found)
  }
  const parts = ['Third-party software in cos-auth-proxy.mjs (bundled by scripts/bundle.mjs).\n']
  for (const [id, { dir, pkg }] of [...packages].sort(([a], [b]) => a.localeCompare(b))) {
    const file = ['LICENSE', 'LICENSE.md', 'LICENSE.txt', 'license', 'LICENCE', 'LICENSE-MIT'].find(f => existsSync(join(dir, f)))
    const text = file === undefined ? `(no licence file; package.json says ${pkg.license})` : readFileSync(join(dir, file), 'utf8').trim()
    parts.push(`${'-'.repeat(72)}\n${id} (${pkg.license ?? 'no licence field'})\n\n${text}\n`)
  }
  return parts.join('\n')
}

const result = await build({
  entryPoints: [join(root, 'src', 'cli.ts')],
  outfile: BUNDLE,
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20.19',
  minify: true,
  // Class and function names stay: pino logs an error's constructor name, and
  // fastify names plugins after their functions.
  keepNames: true,
  sourcemap: 'linked',
  // Stack traces need only names and positions; the sources are in the repository.
  sourcesContent: false,
  legalComments: 'none',
  metafile: true,
  logLevel: 'warning',
  // The CommonJS dependencies require() node's built-ins; an ES module has no require of its own.
  banner: { js: "import{createRequire as __cosCreateRequire}from'node:module';const require=__cosCreateRequire(import.meta.url);" },
  plugins: [replyFromBuildUrl()],
})
writeFileSync(NOTICES, notices(result.metafile.inputs))
const bytes = result.metafile.outputs[relative(root, BUNDLE)]?.bytes ?? 0
process.stdout.write(`${relative(root, BUNDLE)}: ${(bytes / 1024).toFixed(0)} KiB, ${Object.keys(result.metafile.inputs).length} source files\n`)
