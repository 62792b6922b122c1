// What a user checks before installing: the signatures (cosign verify with the
// release key passes; with another key, and on a digest the release did not
// sign, it fails) and the SBOM attested to each platform's digest, read back
// and compared with the packages esbuild put in the bundle, exactly.
import { createHash } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { isDeepStrictEqual } from 'node:util'
import { join } from 'node:path'
import { equal, ok } from '../harness/checks.js'
import { sh } from '../harness/processes.js'

export interface Released {
  cosign: string
  crane: string
  /** cosign.pub of the key the release was signed with, and of another one */
  publicKey: string
  otherKey: string
  image: string // REG/cos-auth-proxy@sha256:<index>
  platforms: Array<{ platform: string, ref: string, sbom: string }>
  chart: string // REG/charts/cos-auth-proxy@sha256:…
  root: string // the repository, whose dist/ the release bundled
}

/**
 * Flags for an offline, key-based check against a plain-HTTP loopback registry: no
 * transparency log, and an empty trusted root, so that cosign asks no TUF repository
 * (it would look up tuf-repo-cdn.sigstore.dev otherwise).
 */
function offlineFlags (): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'cos-release-root-'))
  const root = join(dir, 'trusted-root.json')
  writeFileSync(root, '{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}\n')
  process.on('exit', () => { rmSync(dir, { recursive: true, force: true }) })
  return ['--insecure-ignore-tlog=true', '--trusted-root', root, '--allow-insecure-registry', '--allow-http-registry']
}
let flags: string[] | undefined
const offline = (): string[] => (flags ??= offlineFlags())

function verify (r: Released, key: string, ref: string): { code: number, out: string } {
  const v = sh(r.cosign, ['verify', '--key', key, ...offline(), ref], { timeoutMs: 120_000 })
  return { code: v.code, out: `${v.stdout}${v.stderr}` }
}

const short = (ref: string): string => ref.replace(/@sha256:([0-9a-f]{12})[0-9a-f]+$/, '@sha256:$1…')

export function signatures (r: Released): void {
  for (const ref of [r.image, ...r.platforms.map(p => p.ref), r.chart]) {
    const good = verify(r, r.publicKey, ref)
    ok(good.code === 0, `cosign verify --key <release key> ${short(ref)}: verified`, good.out.slice(-600))
    const bad = verify(r, r.otherKey, ref)
    ok(bad.code !== 0, `cosign verify --key <another key> ${short(ref)}: refused (exit ${bad.code})`, bad.out.slice(-600))
  }
  // A digest nobody signed: the index with one more label.
  const repo = r.image.replace(/@sha256:.*$/, '')
  const unsigned = sh(r.crane, ['mutate', '--insecure', '--label', 'cos-auth-proxy.test=unsigned', '-t', `${repo}:unsigned`, r.platforms[0]?.ref ?? r.image], { timeoutMs: 120_000 })
  const digest = unsigned.stdout.trim().replace(/^.*@/, '')
  ok(unsigned.code === 0 && /^sha256:[0-9a-f]{64}$/.test(digest), `an unsigned image pushed beside it (${digest.slice(0, 19)}…)`, unsigned.stderr)
  const none = verify(r, r.publicKey, `${repo}@${digest}`)
  ok(none.code !== 0, `cosign verify --key <release key> on the unsigned digest: refused (exit ${none.code})`, none.out.slice(-600))
}

interface Component { name: string, version: string, purl?: string, type?: string, hashes?: Array<{ alg: string, content: string }> }
interface Bom { bomFormat?: string, specVersion?: string, metadata?: { component?: Component }, components?: Component[] }

/** name@version of every package with an input in esbuild's metafile, read here independently of scripts/sbom.mjs. */
export function bundledPackages (root: string): string[] {
  const meta = JSON.parse(readFileSync(join(root, 'dist', 'cos-auth-proxy.meta.json'), 'utf8')) as { inputs: Record<string, unknown> }
  const found = new Set<string>()
  for (const input of Object.keys(meta.inputs)) {
    const path = input.replace(/^[\w-]+:/, '') // a plugin's namespace
    const at = path.lastIndexOf('node_modules/')
    if (at < 0) continue
    const rest = path.slice(at + 'node_modules/'.length).split('/')
    const name = rest[0]?.startsWith('@') === true ? `${rest[0]}/${rest[1] ?? ''}` : rest[0] ?? ''
    const dir = join(root, path.slice(0, at), 'node_modules', name)
    if (!existsSync(join(dir, 'package.json'))) continue
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }
    found.add(`${name}@${pkg.version}`)
  }
  return [...found].sort()
}

function attested (r: Released, ref: string): { code: number, stderr: string, boms: Bom[] } {
  const v = sh(r.cosign, ['verify-attestation', '--key', r.publicKey, ...offline(), '--type', 'cyclonedx', ref], { timeoutMs: 120_000 })
  const statements = v.stdout.trim().split('\n').filter(l => l.startsWith('{'))
    .map(l => JSON.parse(Buffer.from((JSON.parse(l) as { payload: string }).payload, 'base64').toString('utf8')) as { predicateType: string, predicate: Bom })
  return { code: v.code, stderr: v.stderr, boms: statements.filter(s => s.predicateType.includes('cyclonedx')).map(s => s.predicate) }
}

export function sbomAttested (r: Released, nodeVersions: Record<string, string>): void {
  const expected = bundledPackages(r.root)
  ok(expected.length > 30 && ['ws', 'semver', 'ajv'].every(n => expected.some(e => e.startsWith(`${n}@`))),
    `${expected.length} packages in the bundle (esbuild's metafile), ws, semver and ajv among them`)
  const bundleSha = createHash('sha256').update(readFileSync(join(r.root, 'dist', 'cos-auth-proxy.mjs'))).digest('hex')
  for (const p of r.platforms) {
    const v = attested(r, p.ref)
    ok(v.code === 0 && v.boms.length === 1, `${p.platform}: cosign verify-attestation --type cyclonedx: verified, one SBOM`, v.stderr.slice(-600))
    const bom = v.boms[0]
    ok(bom?.bomFormat === 'CycloneDX', `${p.platform}: the attested predicate is a CycloneDX BOM (spec ${bom?.specVersion ?? '?'})`)
    const file = JSON.parse(readFileSync(p.sbom, 'utf8')) as Bom
    equal(bom, file, `${p.platform}: the attested SBOM is the file published with the release (${p.sbom.replace(/^.*\//, '')})`)
    const npm = (bom?.components ?? []).filter(c => c.purl?.startsWith('pkg:npm/') === true).map(c => `${c.name}@${c.version}`).sort()
    equal(npm, expected, `${p.platform}: its npm components are exactly the bundle's ${expected.length} packages`)
    const node = (bom?.components ?? []).filter(c => c.purl?.startsWith('pkg:generic/node@') === true).map(c => c.version)
    equal(node, [nodeVersions[p.platform]], `${p.platform}: and the Node runtime the image carries, ${nodeVersions[p.platform] ?? '?'}`)
    const hash = bom?.metadata?.component?.hashes?.find(h => h.alg === 'SHA-256')?.content
    equal(hash, bundleSha, `${p.platform}: the SBOM's subject is the bundle, by its sha256 (${bundleSha.slice(0, 12)}…)`)
  }
  // The index's digest carries both, so that a user who verifies the tag finds them.
  const index = attested(r, r.image)
  const files = r.platforms.map(p => JSON.parse(readFileSync(p.sbom, 'utf8')) as Bom)
  ok(index.code === 0 && index.boms.length === files.length && files.every(f => index.boms.some(b => isDeepStrictEqual(b, f))),
    `the index's digest: cosign verify-attestation finds both platforms' SBOMs (${index.boms.length})`, index.stderr.slice(-600))
}
