// The Access Key pair: read from mounted files or literals, validated as one
// value and held behind a single reference, so a swap is atomic: a request
// signs with the old pair or the new pair, never a mix.
import type { KeyObject } from 'node:crypto'
import { readBoundedFile } from '../mounted/bounded-file.js'
import type { MountedFile, ReadRefusal } from '../mounted/mounted-files.js'
import type { Config, CredentialSource } from '../config/config.js'
import type { Secret } from '../config/secret.js'
import { HeaderMinter, secretKey, type TokenEncoding } from '../token/token.js'

export type PairResult =
  | { readonly ok: true, readonly accessKey: string, readonly key: KeyObject, readonly minter: HeaderMinter }
  | PairFailure

/** `refusal`: the file was refused unread (what is at the path, or a read that never finished). */
export interface PairFailure { readonly ok: false, readonly variable: string, readonly problem: string, readonly refusal?: ReadRefusal }
export type { ReadRefusal }

type ItemResult = { readonly ok: true, readonly value: string } | PairFailure

// The access key is the first field of a `/`-separated token and part of a
// `:`-joined message: either character would make tokens ambiguous.
const ACCESS_KEY = /^[\x21-\x7e]+$/
function accessKeyProblem (key: string): string | undefined {
  if (!ACCESS_KEY.test(key)) return 'must be printable ASCII without spaces'
  if (key.includes('/') || key.includes(':')) return 'must not contain "/" or ":"'
  return undefined
}

/**
 * How an access key is logged: enough to tell keys apart, never all of it.
 * The key is a public identifier, but a pair mounted the wrong way round puts
 * the secret where the key belongs, and a hex or base64 secret passes as a
 * key (issue 43). At most a quarter of it: up to 4 characters at each end
 * ("AKID…WXYZ"), none of a key under 8 characters (only its length).
 */
export function accessKeyHint (key: string): string {
  const n = Math.min(4, Math.floor(key.length / 8))
  return n === 0 ? `(${String(key.length)} characters)` : `${key.slice(0, n)}…${key.slice(-n)}`
}

function literalItem (name: string, secret: Secret): ItemResult {
  const value = secret.reveal().trim()
  return value === '' ? { ok: false, variable: name, problem: 'is empty' } : { ok: true, value }
}

/** A key or secret is a few dozen characters; a file far larger is not one (and is never read whole). */
export const CREDENTIAL_FILE_MAX_BYTES = 4096

function fileItem (name: string, path: string, text: string): ItemResult {
  const value = text.trim()
  if (value === '') return { ok: false, variable: `${name}_FILE`, problem: `file ${JSON.stringify(path)} is empty` }
  return { ok: true, value }
}

async function readItem (name: string, source: CredentialSource): Promise<ItemResult> {
  if (source.value !== undefined) return literalItem(name, source.value)
  const path = source.file ?? ''
  const read = await readBoundedFile(path, CREDENTIAL_FILE_MAX_BYTES)
  if (!read.ok) return { ...read, variable: `${name}_FILE` }
  return fileItem(name, path, read.text)
}

const ITEMS = [['COS_ACCESS_KEY', 'accessKey'], ['COS_ACCESS_KEY_SECRET', 'secret']] as const

/** The items that are files, in order (the key's, then the secret's): what the watcher reads. */
export function credentialFiles (credentials: Config['credentials']): MountedFile[] {
  return ITEMS.flatMap(([name, item]) => {
    const path = credentials[item].file
    return path === undefined ? [] : [{ path, variable: `${name}_FILE`, maxBytes: CREDENTIAL_FILE_MAX_BYTES }]
  })
}

/** The pair from the texts of credentialFiles (in its order) and the literals. Never echoes the secret. */
export function pairFromTexts (credentials: Config['credentials'], encoding: TokenEncoding, texts: readonly string[]): PairResult {
  let next = 0
  const [key, secret] = ITEMS.map(([name, item]) => {
    const source = credentials[item]
    return source.value !== undefined ? literalItem(name, source.value) : fileItem(name, source.file ?? '', texts[next++] ?? '')
  }) as [ItemResult, ItemResult]
  return toPair(credentials, encoding, key, secret)
}

function toPair (credentials: Config['credentials'], encoding: TokenEncoding, key: ItemResult, secret: ItemResult): PairResult {
  if (!key.ok) return key
  if (!secret.ok) return secret
  const problem = accessKeyProblem(key.value)
  if (problem !== undefined) {
    return { ok: false, variable: credentials.accessKey.file === undefined ? 'COS_ACCESS_KEY' : 'COS_ACCESS_KEY_FILE', problem: `access key ${problem}` }
  }
  const hmacKey = secretKey(secret.value)
  return { ok: true, accessKey: key.value, key: hmacKey, minter: new HeaderMinter(key.value, hmacKey, encoding) }
}

/** Reads both items and builds a minter, or says which variable is wrong. Never echoes the secret. */
export async function readPair (credentials: Config['credentials'], encoding: TokenEncoding): Promise<PairResult> {
  const [key, secret] = await Promise.all([
    readItem('COS_ACCESS_KEY', credentials.accessKey),
    readItem('COS_ACCESS_KEY_SECRET', credentials.secret),
  ])
  return toPair(credentials, encoding, key, secret)
}

/**
 * Holds the pair in force. `current` is read on every request; `swap`
 * replaces it in one assignment. Listeners hear about changes (metrics, logs).
 */
export class CredentialStore {
  #minter: HeaderMinter | undefined
  #loadedAt: Date | undefined

  constructor (initial?: HeaderMinter) {
    this.#minter = initial
    this.#loadedAt = initial === undefined ? undefined : new Date()
  }

  get current (): HeaderMinter | undefined {
    return this.#minter
  }

  /** When the pair in force was put in force (for the diagnosis of an upstream 401). */
  get loadedAt (): Date | undefined {
    return this.#loadedAt
  }

  /** Installs `next`; returns true when it is a different pair from the one in force. */
  swap (next: HeaderMinter): boolean {
    const prev = this.#minter
    this.#minter = next
    this.#loadedAt = new Date()
    return prev === undefined || !prev.samePair(next)
  }
}
