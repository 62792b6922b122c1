#!/usr/bin/env node
// check-injector-env.mjs RENDERED.yaml... — the injector Deployment as the
// chart renders it must start `cos-auth-proxy inject` (dist/cos-auth-proxy.mjs,
// the bundle the image runs; dist/cli.js exists only after a full build, not
// on a clean clone): every COS_* it sets accepted, none missing, and the
// sidecar definition in its ConfigMap accepted. Only the file paths (volumes
// in the cluster: the certificate, with a throwaway self-signed pair, and the
// ConfigMap's sidecar.json, written out), the listen addresses and the drain
// delay are replaced. Used by scripts/ci-packaging.sh.
import { execFileSync, spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { clearTimeout, setTimeout } from 'node:timers'
import { join } from 'node:path'
import { parseAllDocuments } from 'yaml'

const dir = mkdtempSync(join(tmpdir(), 'cos-injector-env-'))
execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
  '-subj', '/CN=127.0.0.1', '-keyout', join(dir, 'tls.key'), '-out', join(dir, 'tls.crt')], { stdio: 'ignore' })

function injectorEnv (file) {
  const docs = parseAllDocuments(readFileSync(file, 'utf8')).map(d => d.toJS())
  const sidecar = docs.find(o => o?.kind === 'ConfigMap' && o.data?.['sidecar.json'] !== undefined)
  for (const o of docs) {
    const c = o?.kind === 'Deployment' ? o.spec.template.spec.containers.find(x => x.name === 'injector') : undefined
    if (c !== undefined) return { env: Object.fromEntries(c.env.map(e => [e.name, e.value])), sidecar: sidecar?.data['sidecar.json'] }
  }
  return undefined
}

function start (env) {
  return new Promise(resolve => {
    const child = spawn(process.execPath, ['dist/cos-auth-proxy.mjs', 'inject'], { env, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    const timer = setTimeout(() => { child.kill('SIGKILL') }, 10_000)
    const seen = d => {
      out += d
      if (out.includes('injection webhook listening')) child.kill('SIGTERM')
    }
    child.stdout.on('data', seen)
    child.stderr.on('data', seen)
    child.on('close', code => { clearTimeout(timer); resolve({ code, out }) })
  })
}

let failed = 0
for (const [i, file] of process.argv.slice(2).entries()) {
  const found = injectorEnv(file)
  if (found === undefined || found.sidecar === undefined) { failed++; console.log(`   FAIL ${file}: no injector Deployment and sidecar ConfigMap`); continue }
  const { env } = found
  const sidecarFile = join(dir, `sidecar-${i}.json`)
  writeFileSync(sidecarFile, found.sidecar)
  const image = JSON.stringify(JSON.parse(found.sidecar).container.image)
  const { code, out } = await start({
    PATH: process.env.PATH,
    ...env,
    COS_INJECT_HOST: '127.0.0.1',
    COS_INJECT_PORT: '0',
    COS_ADMIN_HOST: '127.0.0.1',
    COS_ADMIN_PORT: '0',
    COS_INJECT_TLS_CERT_FILE: join(dir, 'tls.crt'),
    COS_INJECT_TLS_KEY_FILE: join(dir, 'tls.key'),
    COS_INJECT_SIDECAR_FILE: sidecarFile,
    COS_SHUTDOWN_DELAY_MS: '0',
  })
  if (code === 0 && out.includes('injection webhook listening') && out.includes(`"image":${image}`)) {
    console.log(`   ${file}: the rendered env and sidecar definition start the webhook (image ${image}), SIGTERM exits 0`)
  } else {
    failed++
    console.log(`   FAIL ${file}: exit ${code}: ${out.trim().split('\n').slice(-3).join(' | ')}`)
  }
}
rmSync(dir, { recursive: true, force: true })
process.exit(failed === 0 ? 0 : 1)
