// The npm package of a release: the bundle and what goes with it, and a
// manifest without dependencies (the bundle carries them: `npx
// cos-auth-proxy` then installs one package, not the 54 of the dependency
// tree). The repository root is not the package: its package.json lists the
// dependencies and the tools, and its prepublishOnly refuses to publish it.
//
// usage: node scripts/npm-package.mjs --out DIR
//   stages the package in a temporary directory (package.json, README.md,
//   LICENSE, dist/cos-auth-proxy.mjs, .mjs.map, .licenses.txt), checks that
//   its bundle answers --version there (no node_modules anywhere above it),
//   runs `npm pack` and writes DIR/cos-auth-proxy-<version>-npm.tgz (not
//   npm's own name, which is the chart's in the same release directory).
//   Prints the staged file list on stderr and the tarball's absolute path as
//   the last line of stdout. Run `npm run build` first.
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/** What the package holds besides its manifest, relative to the package (and to the repository). */
export const PACKAGE_FILES = ['LICENSE', 'README.md', 'dist/cos-auth-proxy.licenses.txt', 'dist/cos-auth-proxy.mjs', 'dist/cos-auth-proxy.mjs.map']
/** The fields of the root package.json the published manifest keeps; everything else (dependencies, scripts, tap, files, private) stays home. */
export const MANIFEST_FIELDS = ['name', 'version', 'description', 'license', 'keywords', 'homepage', 'repository', 'bugs', 'type', 'bin', 'engines']

/** The published manifest, from the root's. */
export function publishedManifest (root) {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
  const manifest = Object.fromEntries(MANIFEST_FIELDS.filter(f => pkg[f] !== undefined).map(f => [f, pkg[f]]))
  for (const [name, target] of Object.entries(manifest.bin ?? {})) {
    if (!PACKAGE_FILES.includes(target)) throw new Error(`package.json: bin ${name} is ${target}, which the package does not hold`)
  }
  return manifest
}

/** Stages the package into `dir` (which must not exist yet or be empty) and checks its bundle runs there. */
export function stage (root, dir) {
  const manifest = publishedManifest(root)
  mkdirSync(join(dir, 'dist'), { recursive: true })
  for (const file of PACKAGE_FILES) {
    if (!existsSync(join(root, file))) throw new Error(`${file} is missing${file.startsWith('dist/') ? ': run npm run build first' : ''}`)
    copyFileSync(join(root, file), join(dir, file))
  }
  writeFileSync(join(dir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`)
  const bin = Object.values(manifest.bin)[0]
  const answered = execFileSync(process.execPath, [bin, '--version'], { cwd: dir, encoding: 'utf8', env: { ...process.env, NODE_PATH: '' } }).trim()
  if (answered !== `${manifest.name} ${manifest.version}`) throw new Error(`the staged ${bin} answered --version with ${JSON.stringify(answered)}, not "${manifest.name} ${manifest.version}"`)
  return manifest
}

/** Stages and packs; returns the tarball's absolute path in `out`. */
export function npmPackage (root, out) {
  const work = mkdtempSync(join(tmpdir(), 'cos-npm-package-'))
  try {
    const dir = join(work, 'package')
    const manifest = stage(root, dir)
    mkdirSync(out, { recursive: true })
    // --ignore-scripts: the staged manifest has none, and a user's npm config must not add any.
    const [packed] = JSON.parse(execFileSync('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', work], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }))
    process.stderr.write(`${packed.files.map(f => `  ${f.path} (${f.size} B)`).join('\n')}\n${packed.id}: ${packed.files.length} files, ${packed.size} B packed\n`)
    const tgz = resolve(out, `${manifest.name}-${manifest.version}-npm.tgz`)
    copyFileSync(join(work, packed.filename), tgz) // not rename: the temporary directory may be on another file system
    return tgz
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    const { values } = parseArgs({ options: { out: { type: 'string' } }, strict: true })
    if (values.out === undefined) throw new Error('--out DIR is required (usage: node scripts/npm-package.mjs --out DIR)')
    process.stdout.write(`${npmPackage(ROOT, values.out)}\n`)
  } catch (err) {
    process.stderr.write(`npm-package.mjs: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exit(2)
  }
}
