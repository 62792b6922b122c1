// The SBOM of what the image runs: one bundled file (dist/cos-auth-proxy.mjs)
// and the Node runtime. An image scanner sees neither the npm packages inside
// the bundle (there is no node_modules in the image) nor which of them esbuild
// kept; `npm sbom --omit dev` lists the dependency tree, not the bundle (it
// misses what only the build pulls in, such as ajv's runtime, and lists what
// esbuild left out). esbuild's metafile (scripts/bundle.mjs writes it beside
// the bundle) names every file that went in: the packages are the
// node_modules directories those files belong to.
//
// usage: node scripts/sbom.mjs --metafile dist/cos-auth-proxy.meta.json --bundle dist/cos-auth-proxy.mjs
//          --node-version 24.x.y --platform linux/arm64 [--out FILE] [--timestamp ISO-8601] [--root DIR]
// Writes CycloneDX 1.6 JSON to FILE (stdout without --out). The same inputs give
// the same bytes: sorted, no timestamp unless --timestamp, a serialNumber
// derived from the content. --root (default: this repository) is the
// directory the metafile's paths are relative to.
import { createHash } from 'node:crypto'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { fileURLToPath, pathToFileURL } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const PLATFORM_PROPERTY = 'cos-auth-proxy:platform'

/** The path of a metafile input without its esbuild namespace ("undici-parts:node_modules/undici/index.js"). */
function pathOf (input) {
  return input.replace(/^[a-z][\w-]*:/i, '')
}

/** The package directory a bundled file belongs to (the innermost node_modules/<name> or node_modules/@scope/<name>), or undefined. */
export function packageDirOf (input) {
  const path = pathOf(input)
  const last = [...path.matchAll(/(?<=^|\/)node_modules\/(?:@[^/]+\/)?[^/]+(?=\/)/g)].at(-1)
  return last === undefined ? undefined : path.slice(0, last.index + last[0].length)
}

export function purlOf (name, version) {
  return `pkg:npm/${name.startsWith('@') ? `%40${name.slice(1)}` : name}@${encodeURIComponent(version)}`
}

/** A package.json's licence, as npm writes it today or in the older shapes ({ type }, licenses: [...]). */
function licenseOf (pkg) {
  const l = pkg.license ?? pkg.licenses
  if (typeof l === 'string') return l
  if (Array.isArray(l)) return l.map(x => typeof x === 'string' ? x : x?.type).filter(Boolean).join(' OR ') || undefined
  return typeof l?.type === 'string' ? l.type : undefined
}

/**
 * Every npm package with at least one file in the bundle: name (with its
 * scope), version and licence read from its own package.json under `root`,
 * the directories it was bundled from (a version can be nested in several
 * places), sorted by name then version. `meta` is esbuild's metafile.
 */
export function packagesOfMetafile (meta, root = ROOT) {
  const packages = new Map()
  for (const dir of new Set(Object.keys(meta.inputs).map(packageDirOf).filter(d => d !== undefined))) {
    const file = join(root, dir, 'package.json')
    if (!existsSync(file)) throw new Error(`${dir}: no package.json under ${root}: the metafile was written for another tree`)
    const pkg = JSON.parse(readFileSync(file, 'utf8'))
    if (typeof pkg.name !== 'string' || typeof pkg.version !== 'string') throw new Error(`${file}: no name or version`)
    const key = `${pkg.name}@${pkg.version}`
    const seen = packages.get(key)
    if (seen === undefined) packages.set(key, { name: pkg.name, version: pkg.version, license: licenseOf(pkg), purl: purlOf(pkg.name, pkg.version), dirs: [dir] })
    else seen.dirs.push(dir)
  }
  const order = (a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : a.version < b.version ? -1 : a.version > b.version ? 1 : 0
  return [...packages.values()].sort(order).map(p => ({ ...p, dirs: p.dirs.sort() }))
}

/** CycloneDX's licence choice: an SPDX id, an SPDX expression, or a plain name (UNLICENSED, SEE LICENSE IN …). */
function licensesOf (license) {
  if (license === undefined) return undefined
  if (/^(UNLICENSED|SEE LICEN[CS]E IN )/i.test(license)) return [{ license: { name: license } }]
  if (/^[A-Za-z0-9][A-Za-z0-9.+-]*$/.test(license)) return [{ license: { id: license } }]
  return [{ expression: license }]
}

/**
 * Who uses whom inside the bundle, from the metafile's imports: the
 * application (src/ and the build's own stand-ins) and each package, to the
 * packages whose files they import.
 */
function dependenciesOf (meta, packages, appRef) {
  const refOfDir = new Map(packages.flatMap(p => p.dirs.map(d => [d, p.purl])))
  const edges = new Map([[appRef, new Set()], ...packages.map(p => [p.purl, new Set()])])
  for (const [input, { imports = [] }] of Object.entries(meta.inputs)) {
    const dir = packageDirOf(input)
    const from = dir === undefined ? appRef : refOfDir.get(dir)
    for (const i of imports) {
      if (i.external === true) continue
      const to = refOfDir.get(packageDirOf(i.path) ?? '')
      if (to !== undefined && to !== from) edges.get(from).add(to)
    }
  }
  return [...edges].sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0).map(([ref, to]) => ({ ref, dependsOn: [...to].sort() }))
}

/** The integrity npm recorded for a package directory (package-lock.json), as CycloneDX hashes. */
function lockHashes (lock, dirs) {
  const integrity = lock?.packages?.[dirs[0]]?.integrity
  const m = /^sha512-(.+)$/.exec(integrity ?? '')
  return m === null ? undefined : [{ alg: 'SHA-512', content: Buffer.from(m[1], 'base64').toString('hex') }]
}

/** A name-based (version 5) UUID: the same content, the same serial number. */
function uuidV5 (name) {
  const namespace = Buffer.from('6ba7b8119dad11d180b400c04fd430c8', 'hex') // RFC 4122's URL namespace
  const h = createHash('sha1').update(namespace).update(name).digest()
  h[6] = (h[6] & 0x0f) | 0x50
  h[8] = (h[8] & 0x3f) | 0x80
  const x = h.subarray(0, 16).toString('hex')
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`
}

/**
 * The SBOM as an object. `bundle` is the bundle's bytes; `app` the root
 * package.json ({ name, version, license, description }).
 */
export function sbomOf ({ meta, root = ROOT, bundle, app, nodeVersion, platform, timestamp, lock }) {
  if (!/^\d+\.\d+\.\d+$/.test(nodeVersion ?? '')) throw new Error(`--node-version: expected X.Y.Z, got ${String(nodeVersion)}`)
  if (!/^[a-z0-9]+\/[a-z0-9]+(\/[a-z0-9]+)?$/.test(platform ?? '')) throw new Error(`--platform: expected OS/ARCH (linux/arm64), got ${String(platform)}`)
  if (timestamp !== undefined && Number.isNaN(Date.parse(timestamp))) throw new Error(`--timestamp: not a date: ${timestamp}`)
  const packages = packagesOfMetafile(meta, root)
  const appRef = purlOf(app.name, app.version)
  const nodeRef = `pkg:generic/node@${nodeVersion}`
  const bom = {
    $schema: 'http://cyclonedx.org/schema/bom-1.6.schema.json',
    bomFormat: 'CycloneDX',
    specVersion: '1.6',
    serialNumber: '',
    version: 1,
    metadata: {
      ...(timestamp === undefined ? {} : { timestamp: new Date(timestamp).toISOString() }),
      tools: { components: [{ type: 'application', name: 'scripts/sbom.mjs', version: app.version, description: `${app.name}'s SBOM writer: the packages in esbuild's metafile` }] },
      component: {
        type: 'application',
        'bom-ref': appRef,
        name: app.name,
        version: app.version,
        description: app.description,
        licenses: licensesOf(app.license),
        purl: appRef,
        hashes: [{ alg: 'SHA-256', content: createHash('sha256').update(bundle).digest('hex') }],
      },
      properties: [{ name: PLATFORM_PROPERTY, value: platform }],
    },
    components: [
      ...packages.map(p => ({
        type: 'library',
        'bom-ref': p.purl,
        name: p.name,
        version: p.version,
        licenses: licensesOf(p.license),
        hashes: lockHashes(lock, p.dirs),
        purl: p.purl,
        // cyclonedx-npm's name for where a package was installed
        properties: p.dirs.map(d => ({ name: 'cdx:npm:package:path', value: d })),
      })),
      {
        type: 'platform',
        'bom-ref': nodeRef,
        name: 'node',
        version: nodeVersion,
        description: 'Node.js, the runtime the bundle runs on',
        licenses: [{ license: { id: 'MIT' } }],
        purl: nodeRef,
        cpe: `cpe:2.3:a:nodejs:node.js:${nodeVersion}:*:*:*:*:*:*:*`,
      },
    ],
    dependencies: dependenciesOf(meta, packages, appRef).map(d => d.ref === appRef ? { ...d, dependsOn: [...d.dependsOn, nodeRef].sort() } : d),
  }
  const content = JSON.stringify(bom)
  bom.serialNumber = `urn:uuid:${uuidV5(`${app.name}-sbom:${createHash('sha256').update(content).digest('hex')}`)}`
  return bom
}

/** The SBOM as the file's text: JSON (undefined fields left out), two spaces, a final newline. */
export function sbomText (bom) {
  return `${JSON.stringify(bom, null, 2)}\n`
}

function main () {
  const { values } = parseArgs({
    options: {
      metafile: { type: 'string' },
      bundle: { type: 'string' },
      'node-version': { type: 'string' },
      platform: { type: 'string' },
      out: { type: 'string' },
      timestamp: { type: 'string' },
      root: { type: 'string' },
    },
    strict: true,
  })
  for (const name of ['metafile', 'bundle', 'node-version', 'platform']) {
    if (values[name] === undefined) throw new Error(`--${name} is required (usage: node scripts/sbom.mjs --metafile F --bundle F --node-version X.Y.Z --platform OS/ARCH [--out FILE] [--timestamp ISO] [--root DIR])`)
  }
  const root = values.root ?? ROOT
  const lockFile = join(root, 'package-lock.json')
  const text = sbomText(sbomOf({
    meta: JSON.parse(readFileSync(values.metafile, 'utf8')),
    root,
    bundle: readFileSync(values.bundle),
    app: JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')),
    nodeVersion: values['node-version'].replace(/^v/, ''),
    platform: values.platform,
    timestamp: values.timestamp,
    lock: existsSync(lockFile) ? JSON.parse(readFileSync(lockFile, 'utf8')) : undefined,
  }))
  if (values.out === undefined) process.stdout.write(text)
  else writeFileSync(values.out, text)
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    main()
  } catch (err) {
    process.stderr.write(`sbom.mjs: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exit(2)
  }
}
