// A private CA, a server certificate for 127.0.0.1 and a client certificate,
// made with openssl in a temp dir for the test run.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

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
