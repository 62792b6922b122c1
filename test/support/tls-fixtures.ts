// A private CA, a server certificate for 127.0.0.1 and a client certificate,
// made with openssl in a temp dir for the test run.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http'
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { listenOnLoopback } from './helpers.js'

export interface Pki {
  readonly dir: string
  readonly caFile: string
  readonly ca: string
  readonly serverKey: string
  readonly serverCert: string
  readonly clientCertFile: string
  readonly clientKeyFile: string
  readonly otherCaFile: string
  cleanup: () => void
}

function openssl (dir: string, args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' })
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']

function ca (dir: string, name: string): void {
  openssl(dir, ['req', '-x509', ...EC, '-days', '2', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.pem`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'])
}

function leaf (dir: string, name: string, caName: string): void {
  openssl(dir, ['req', ...EC, '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`])
  openssl(dir, ['x509', '-req', '-in', `${name}.csr`, '-CA', `${caName}.pem`, '-CAkey', `${caName}.key`, '-CAcreateserial',
    '-days', '2', '-out', `${name}.pem`, '-extfile', `${name}.ext`])
}

export function makePki (): Pki {
  const dir = mkdtempSync(join(tmpdir(), 'cos-pki-'))
  ca(dir, 'ca')
  ca(dir, 'other-ca')
  execFileSync('sh', ['-c', 'printf "subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n" > server.ext; printf "extendedKeyUsage=clientAuth\\n" > client.ext'], { cwd: dir })
  leaf(dir, 'server', 'ca')
  leaf(dir, 'client', 'ca')
  const read = (f: string): string => readFileSync(join(dir, f), 'utf8')
  return {
    dir,
    caFile: join(dir, 'ca.pem'),
    ca: read('ca.pem'),
    serverKey: read('server.key'),
    serverCert: read('server.pem'),
    clientCertFile: join(dir, 'client.pem'),
    clientKeyFile: join(dir, 'client.key'),
    otherCaFile: join(dir, 'other-ca.pem'),
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  }
}

export interface HttpsUpstream {
  readonly url: string
  /** The headers of each request received. */
  readonly received: IncomingHttpHeaders[]
  readonly server: HttpsServer
  close: () => Promise<void>
}

/** An HTTPS server on 127.0.0.1 with the PKI's server certificate; it answers with the CN of the client's certificate, if any. */
export async function httpsUpstream (pki: Pki, requireClientCert: boolean): Promise<HttpsUpstream> {
  const received: IncomingHttpHeaders[] = []
  const server = createHttpsServer({
    key: pki.serverKey,
    cert: pki.serverCert,
    ...(requireClientCert ? { ca: pki.ca, requestCert: true, rejectUnauthorized: true } : {}),
  }, (req: IncomingMessage, res: ServerResponse) => {
    received.push(req.headers)
    // An https server's request socket is a TLSSocket.
    const socket = req.socket as unknown as { getPeerCertificate: () => { subject?: { CN?: string } } }
    res.setHeader('content-type', 'application/json')
    res.end(JSON.stringify({ client: socket.getPeerCertificate().subject?.CN ?? null }))
  })
  const port = await listenOnLoopback(server)
  return {
    url: `https://127.0.0.1:${port}`,
    received,
    server,
    close: () => new Promise(resolve => { server.closeAllConnections(); server.close(() => resolve()) }),
  }
}

export interface DatedCertificate {
  readonly cert: string
  readonly key: string
  /** Unix seconds: the earliest and the latest the certificate's notAfter can be (now + `days`, around the openssl run). */
  readonly notAfterWithin: readonly [number, number]
  /** Whether `seconds` is that notAfter (within the bounds). */
  readonly isNotAfter: (seconds: number | undefined) => boolean
}

/** A self-signed certificate for 127.0.0.1 (and its key) that expires `days` days from now, made in `dir`. */
export function datedCertificate (dir: string, name: string, days: number): DatedCertificate {
  const before = Math.floor(Date.now() / 1000)
  openssl(dir, ['req', '-x509', ...EC, '-days', String(days), '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.pem`,
    '-addext', 'subjectAltName=IP:127.0.0.1'])
  const after = Math.ceil(Date.now() / 1000)
  const [low, high] = [before + days * 86400, after + days * 86400]
  return {
    cert: readFileSync(join(dir, `${name}.pem`), 'utf8'),
    key: readFileSync(join(dir, `${name}.key`), 'utf8'),
    notAfterWithin: [low, high],
    isNotAfter: seconds => seconds !== undefined && seconds >= low && seconds <= high,
  }
}
