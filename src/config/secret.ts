import { inspect } from 'node:util'

const REDACTED = '[redacted]'

/**
 * A string that refuses to be printed: JSON, template literals, String(),
 * util.inspect and pino all see "[redacted]". Only reveal() gives the value,
 * so every place that needs the secret is one grep away.
 */
export class Secret {
  readonly #value: string

  constructor (value: string) {
    this.#value = value
  }

  reveal (): string {
    return this.#value
  }

  toString (): string {
    return REDACTED
  }

  toJSON (): string {
    return REDACTED
  }

  [inspect.custom] (): string {
    return REDACTED
  }

  static readonly REDACTED = REDACTED
}
