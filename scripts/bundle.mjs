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
// never runs mock-api's code (docs/development.md).
import { build } from 'esbuild'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, relative, sep } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
export const BUNDLE = join(root, 'dist', 'cos-auth-proxy.mjs')
const NOTICES = join(root, 'dist', 'cos-auth-proxy.licenses.txt')
// esbuild's account of what went into the bundle: scripts/sbom.mjs lists its packages.
const METAFILE = join(root, 'dist', 'cos-auth-proxy.meta.json')
/**
 * The schema src/config/config.ts hands env-schema, captured by running its
 * loadConfig against a stand-in env-schema (bundled on its own into a
 * temporary file).
 */
async function configSchema () {
  const out = await build({
    stdin: {
      contents: `import { loadConfig } from ${JSON.stringify(join(root, 'src', 'config', 'config.ts'))}
        try { loadConfig({ dotenv: false, env: {} }) } catch {}
        export const schema = globalThis.__cosConfigSchema`,
      resolveDir: root,
      loader: 'ts',
    },
    bundle: true,
    platform: 'node',
    format: 'esm',
    write: false,
    logLevel: 'warning',
    plugins: [{
      name: 'capture-env-schema',
      setup (b) {
        b.onResolve({ filter: /^env-schema$/ }, () => ({ path: 'capture', namespace: 'capture-env-schema' }))
        b.onLoad({ filter: /.*/, namespace: 'capture-env-schema' }, () => ({
          contents: 'export default function envSchema (opts) { globalThis.__cosConfigSchema = structuredClone(opts.schema); throw new Error("captured") }',
          loader: 'js',
        }))
      },
    }],
  })
  const dir = mkdtempSync(join(tmpdir(), 'cos-bundle-'))
  try {
    const file = join(dir, 'config-schema.mjs')
    writeFileSync(file, out.outputFiles[0].text)
    const { schema } = await import(pathToFileURL(file).href)
    if (schema === undefined) throw new Error('src/config/config.ts did not call env-schema: the bundle\'s precompiled validator has nothing to replace')
    return schema
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/**
 * env-schema compiles its options' schema, JSON Schema's meta-schema and the
 * configuration's schema with ajv at every start: about 100 ms of the start
 * on Node 24 (docs/performance.md). The bundle validates the same schema
 * with the same ajv options, compiled here into plain code (ajv standalone):
 * src/config/config.ts's env-schema import resolves to a stand-in that runs it, and
 * hands anything else (another schema, env or dotenv set) to the real
 * env-schema, which stays in the bundle but is evaluated only then.
 */
function configValidatorAtBuildTime () {
  const require = createRequire(join(root, 'package.json'))
  const envSchemaMain = require.resolve('env-schema')
  return {
    name: 'config-validator-at-build-time',
    setup (b) {
      b.onResolve({ filter: /^env-schema$/ }, args => args.importer.startsWith(join(root, 'src'))
        ? { path: 'env-schema', namespace: 'precompiled-config' }
        : undefined)
      b.onLoad({ filter: /^env-schema$/, namespace: 'precompiled-config' }, async () => {
        const source = readFileSync(envSchemaMain, 'utf8')
        // The options env-schema 8 gives ajv: the compiled code must be what it would compile.
        const options = { allErrors: true, removeAdditional: true, useDefaults: true, coerceTypes: true, allowUnionTypes: true, addUsedSchema: false }
        const literal = Object.entries(options).map(([k, v]) => `${k}: ${v}`).join(',\\s*')
        if (!new RegExp(`new Ajv\\(\\{\\s*${literal},\\s*keywords: \\[separator\\],`).test(source)) {
          throw new Error(`${envSchemaMain}: env-schema no longer builds ajv as scripts/bundle.mjs expects; update configValidatorAtBuildTime`)
        }
        const Ajv = require('ajv')
        const standaloneCode = require('ajv/dist/standalone').default
        const schema = await configSchema()
        schema.additionalProperties = false // as env-schema does before validating
        const ajv = new Ajv({ ...options, keywords: [require('env-schema').keywords.separator], code: { source: true } })
        const validator = standaloneCode(ajv, ajv.compile(schema))
        return {
          contents: `const validate = (() => { const module = { exports: {} }; ${validator}; return module.exports })()
const SCHEMA = ${JSON.stringify(JSON.stringify(schema))}
module.exports = function envSchema (opts) {
  const schema = { ...opts.schema, additionalProperties: false }
  if (opts.env !== false || opts.dotenv !== false || JSON.stringify(schema) !== SCHEMA) return require(${JSON.stringify(envSchemaMain)})(opts)
  const data = Object.assign({}, ...[opts.data ?? {}].flat())
  if (validate(data)) return data
  const error = new Error(validate.errors.map(e => 'env' + e.instancePath + ' ' + e.message).join(', '))
  error.errors = validate.errors
  throw error
}
module.exports.default = module.exports
`,
          loader: 'js',
          resolveDir: dirname(envSchemaMain),
        }
      })
    },
  }
}

/**
 * fastify() requires its schema compilers (@fastify/ajv-compiler,
 * @fastify/fast-json-stringify-compiler, and with them ajv and
 * fast-json-stringify) for every instance, though it calls them only for a
 * route that declares a schema, and this program declares none. In the
 * bundle each is a stand-in that evaluates the real package on its first
 * call: ~40 ms less at start on Node 24, no behaviour changed.
 */
function schemaCompilersOnFirstUse () {
  return onFirstUse('schema-compilers-on-first-use', /^@fastify\/(ajv-compiler|fast-json-stringify-compiler)$/, real => `function Selector (...options) {
  let build
  return function (...args) {
    build ??= require(${JSON.stringify(real)})(...options)
    return build(...args)
  }
}
module.exports = Selector
module.exports.default = Selector
`)
}

/**
 * A plugin that resolves the packages `filter` matches to a stand-in,
 * `standIn(realPath)`, which requires the real module (still bundled, but
 * evaluated only when that require runs).
 */
function onFirstUse (name, filter, standIn) {
  return {
    name,
    setup (b) {
      b.onResolve({ filter }, async args => {
        if (args.namespace === name) return undefined
        const real = await b.resolve(args.path, { kind: args.kind, importer: args.importer, resolveDir: args.resolveDir, namespace: name })
        if (real.errors.length > 0) return { errors: real.errors }
        // Relative: the path names the module in the bundle, which must not depend on where it was built.
        return { path: relative(root, real.path), namespace: name }
      })
      b.onLoad({ filter: /.*/, namespace: name }, args => {
        const real = join(root, args.path)
        return { contents: standIn(real), loader: 'js', resolveDir: dirname(real) }
      })
    },
  }
}

/**
 * src/patches/http-proxy-destination.ts's shortcut, put in front of the
 * resolveDestination that @fastify/http-proxy's handler runs per request
 * (three URL parses): the published check still runs whenever the shortcut
 * cannot answer from the string alone.
 */
function httpProxyDestinationShortcut () {
  const file = join(root, 'src', 'patches', 'http-proxy-destination.ts')
  const call = '    resolveDestination(dest, effectiveRewritePrefix, upstream || undefined)\n    return replyHandler('
  let patched = 0
  return {
    name: 'http-proxy-destination-shortcut',
    setup (b) {
      b.onLoad({ filter: /[\\/]@fastify[\\/]http-proxy[\\/]index\.js$/ }, args => {
        const wanted = /PATCHED_HTTP_PROXY = '([^']+)'/.exec(readFileSync(file, 'utf8'))?.[1]
        const { version } = JSON.parse(readFileSync(join(dirname(args.path), 'package.json'), 'utf8'))
        const source = readFileSync(args.path, 'utf8')
        if (version !== wanted || source.split(call).length !== 2) throw new Error(`@fastify/http-proxy is ${version}; src/patches/http-proxy-destination.ts is written for the handler of ${wanted}`)
        patched++
        // Required once, when http-proxy loads: in the bundle a require() of
        // an ES module copies its namespace into a new object at every call.
        const shortcut = '    if (!__cosDestinationShortcut.destinationWithinPrefix(dest, effectiveRewritePrefix)) resolveDestination(dest, effectiveRewritePrefix, upstream || undefined)\n    return replyHandler('
        return { contents: `const __cosDestinationShortcut = require(${JSON.stringify(file)})\n${source.replace(call, shortcut)}`, loader: 'js' }
      })
      b.onEnd(result => {
        if (result.errors.length === 0 && patched !== 1) throw new Error(`@fastify/http-proxy's index.js was patched ${patched} times, not once`)
      })
    },
  }
}

/**
 * undici's index evaluates all of undici (fetch, WebSocket, caches, mocks,
 * every interceptor) for the few dispatchers the proxy and reply-from use:
 * about 3.5 MB of heap every pod keeps. In the bundle, `undici` resolves to
 * a stand-in with the index's export names, each a getter that evaluates
 * only the module behind that name on first use (the very file the index
 * would have required, so classes and `instanceof` are the same) and then
 * becomes a plain property. Names not listed here evaluate the whole index.
 */
function undiciPartsOnFirstUse () {
  const require = createRequire(join(root, 'package.json'))
  const main = require.resolve('undici')
  // The index also gives every dispatcher its request()/stream()/… methods
  // (Object.assign(Dispatcher.prototype, api)); withApi does that once,
  // before the first dispatcher is handed out.
  const parts = {
    Dispatcher: "withApi(require('./lib/dispatcher/dispatcher'))",
    Client: "withApi(require('./lib/dispatcher/client'))",
    Pool: "withApi(require('./lib/dispatcher/pool'))",
    BalancedPool: "withApi(require('./lib/dispatcher/balanced-pool'))",
    Agent: "withApi(require('./lib/dispatcher/agent'))",
    ProxyAgent: "withApi(require('./lib/dispatcher/proxy-agent'))",
    errors: "require('./lib/core/errors')",
    buildConnector: "require('./lib/core/connect')",
    getGlobalDispatcher: "withApi(require('./lib/global').getGlobalDispatcher)",
    setGlobalDispatcher: "withApi(require('./lib/global').setGlobalDispatcher)",
  }
  return {
    name: 'undici-parts-on-first-use',
    setup (b) {
      b.onResolve({ filter: /^undici$/ }, () => ({ path: relative(root, main), namespace: 'undici-parts' }))
      b.onLoad({ filter: /.*/, namespace: 'undici-parts' }, () => {
        const names = Object.keys(require('undici'))
        const missing = Object.keys(parts).filter(n => !names.includes(n))
        if (missing.length > 0) throw new Error(`undici no longer exports ${missing.join(', ')}: update undiciPartsOnFirstUse in scripts/bundle.mjs`)
        const getters = names.map(n => `  ${JSON.stringify(n)}: () => ${parts[n] ?? `require(${JSON.stringify(main)})[${JSON.stringify(n)}]`},`)
        return {
          contents: `let api
function withApi (value) {
  if (api === undefined) {
    api = require('./lib/api')
    Object.assign(require('./lib/dispatcher/dispatcher').prototype, api)
  }
  return value
}
const parts = {
${getters.join('\n')}
}
for (const [name, load] of Object.entries(parts)) {
  Object.defineProperty(module.exports, name, {
    configurable: true,
    enumerable: true,
    get () {
      const value = load()
      Object.defineProperty(module.exports, name, { value, enumerable: true })
      return value
    },
  })
}
`,
          loader: 'js',
          resolveDir: dirname(main),
        }
      })
    },
  }
}

/**
 * @fastify/http-proxy requires ws at load time for WebSocket proxying, which
 * this program turns off on every route; in the bundle ws is evaluated only
 * if something touches it.
 */
function wsOnFirstUse () {
  return onFirstUse('ws-on-first-use', /^ws$/, real => `module.exports = new Proxy({}, { get: (_, name) => require(${JSON.stringify(real)})[name] })\n`)
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
  minifyWhitespace: true,
  minifySyntax: true,
  // Identifiers are kept as written, so class and function names stay (pino
  // logs an error's constructor name; fastify names plugins after their
  // functions) without esbuild's keepNames, which wraps every function and
  // class in a helper that sets its name with Object.defineProperty: also
  // each closure a request creates (fastify's hooks and reply, undici's
  // writer), ~3 µs per request. Only names the bundle's one scope makes
  // collide are renamed (test/bundle.test.ts checks that no error class is).
  minifyIdentifiers: false,
  keepNames: false,
  sourcemap: 'linked',
  // Stack traces need only names and positions; the sources are in the repository.
  sourcesContent: false,
  legalComments: 'none',
  metafile: true,
  logLevel: 'warning',
  // The CommonJS dependencies require() node's built-ins; an ES module has no require of its own.
  banner: { js: "import{createRequire as __cosCreateRequire}from'node:module';const require=__cosCreateRequire(import.meta.url);" },
  plugins: [configValidatorAtBuildTime(), schemaCompilersOnFirstUse(), undiciPartsOnFirstUse(), wsOnFirstUse(), httpProxyDestinationShortcut()],
})
writeFileSync(NOTICES, notices(result.metafile.inputs))
writeFileSync(METAFILE, `${JSON.stringify(result.metafile)}\n`)
const bytes = result.metafile.outputs[relative(root, BUNDLE)]?.bytes ?? 0
process.stdout.write(`${relative(root, BUNDLE)}: ${(bytes / 1024).toFixed(0)} KiB, ${Object.keys(result.metafile.inputs).length} source files\n`)
