// Types of scripts/sbom.mjs, for the tests that import it.

/** The part of esbuild's metafile scripts/sbom.mjs reads. */
export interface Metafile {
  inputs: Record<string, { imports?: { path: string, kind?: string, external?: boolean }[] }>
  outputs?: Record<string, { bytes: number }>
}

export interface BundledPackage {
  name: string
  version: string
  license: string | undefined
  /** pkg:npm/…@version, also the component's bom-ref */
  purl: string
  /** where it was bundled from, relative to the root: node_modules/…, sorted */
  dirs: string[]
}

export function packageDirOf (input: string): string | undefined
export function purlOf (name: string, version: string): string
export function packagesOfMetafile (meta: Metafile, root?: string): BundledPackage[]
export function sbomOf (options: {
  meta: Metafile
  root?: string
  bundle: Buffer | string
  app: { name: string, version: string, license?: string, description?: string }
  nodeVersion: string
  platform: string
  timestamp?: string
  lock?: unknown
}): Record<string, unknown>
export function sbomText (bom: Record<string, unknown>): string
