// Captures, byte for byte, the requests a real Chromium sends to a local
// proxy port when a web page attacks it, for test/security/browser.test.ts to
// replay (CI has no browser). Run by hand where Debian's chromium is installed:
//
//   node scripts/capture-browser-requests.mjs [/usr/bin/chromium]
//
// A raw TCP server on 127.0.0.1:P stands for the proxy and records each
// request. Three browser runs:
//  - a page on another origin (http://127.0.0.2:Q) loads an <img>, sends a
//    no-cors fetch POST and submits a form to http://127.0.0.1:P/quitquitquit;
//  - a page on http://rebind.test:P, with rebind.test resolved to 127.0.0.1
//    (DNS rebinding, as --host-resolver-rules fakes it), fetches from its own
//    origin: a GET whose answer it reads and a POST;
//  - the proxy's URL typed in the address bar (the request a developer makes).
// Writes test/fixtures/browser/*.http and prints what it wrote.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { createServer as createNetServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const chromiumPath = process.argv[2] ?? '/usr/bin/chromium'
const fixtures = fileURLToPath(new URL('../test/fixtures/browser/', import.meta.url))

/** Every complete request received, in order. */
const captured = []

const REBOUND_PAGE = `<!doctype html><title>rebound</title><script>
fetch('/management/v1/clusters').then(r => r.text()).then(text => { document.title = 'read: ' + text })
  .then(() => fetch('/management/v1/clusters', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":"rebound"}' }))
</script>`

function answer (socket, body, type) {
  socket.end(`HTTP/1.1 200 OK\r\ncontent-type: ${type}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`)
}

const proxy = createNetServer(socket => {
  let bytes = Buffer.alloc(0)
  socket.on('error', () => {})
  socket.on('data', chunk => {
    bytes = Buffer.concat([bytes, chunk])
    const headEnd = bytes.indexOf('\r\n\r\n')
    if (headEnd < 0) return
    const head = bytes.subarray(0, headEnd).toString('latin1')
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0)
    if (bytes.length < headEnd + 4 + length) return
    const requestLine = head.split('\r\n')[0]
    captured.push({ requestLine, bytes: bytes.subarray(0, headEnd + 4 + length) })
    if (requestLine.startsWith('GET /rebound-page ')) answer(socket, REBOUND_PAGE, 'text/html')
    else answer(socket, '{"ok":true}', 'application/json')
  })
})
await new Promise(resolve => proxy.listen(0, '127.0.0.1', resolve))
const P = proxy.address().port

const attackPage = createHttpServer((_req, res) => {
  res.setHeader('content-type', 'text/html')
  res.end(`<!doctype html><title>another site</title>
<img src="http://127.0.0.1:${P}/management/v1/clusters?via=img">
<form method="POST" action="http://127.0.0.1:${P}/quitquitquit"><input name="x" value="1"></form>
<script>
fetch('http://127.0.0.1:${P}/management/v1/clusters', { method: 'POST', mode: 'no-cors', headers: { 'content-type': 'text/plain' }, body: '{"name":"evil"}' })
  .finally(() => setTimeout(() => document.forms[0].submit(), 300))
</script>`)
})
await new Promise(resolve => attackPage.listen(0, '127.0.0.2', resolve))
const Q = attackPage.address().port

/** Opens `url` in a headless Chromium until `count` requests have arrived (at most 30 s); returns them. */
async function browse (url, count, flags = []) {
  const profile = mkdtempSync(join(tmpdir(), 'capture-chromium-'))
  const first = captured.length
  const chromium = spawn(chromiumPath, ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`, ...flags, url], { stdio: 'ignore' })
  const deadline = Date.now() + 30_000
  while (captured.length - first < count && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 100))
  chromium.kill('SIGKILL')
  await new Promise(resolve => chromium.once('close', resolve))
  rmSync(profile, { recursive: true, force: true })
  return captured.slice(first)
}

/** The request whose request line starts with `start`, or a failure naming what arrived. */
function pick (requests, start) {
  const found = requests.find(r => r.requestLine.startsWith(start))
  if (found === undefined) throw new Error(`no "${start}" among: ${requests.map(r => r.requestLine).join(' | ')}`)
  return found.bytes
}

const crossSite = await browse(`http://127.0.0.2:${Q}/`, 3)
const rebound = await browse(`http://rebind.test:${P}/rebound-page`, 3, ['--host-resolver-rules=MAP rebind.test 127.0.0.1'])
const typed = await browse(`http://127.0.0.1:${P}/management/v1/clusters`, 1)
const files = {
  'cross-site-img-get.http': pick(crossSite, 'GET /management/v1/clusters?via=img '),
  'cross-site-fetch-no-cors-post.http': pick(crossSite, 'POST /management/v1/clusters '),
  'cross-site-form-post-quitquitquit.http': pick(crossSite, 'POST /quitquitquit '),
  'rebound-fetch-get.http': pick(rebound, 'GET /management/v1/clusters '),
  'rebound-fetch-post.http': pick(rebound, 'POST /management/v1/clusters '),
  'address-bar-get.http': pick(typed, 'GET /management/v1/clusters '),
}
for (const [name, bytes] of Object.entries(files)) {
  writeFileSync(join(fixtures, name), bytes)
  console.log(`${name}: ${bytes.toString('latin1').split('\r\n')[0]}`)
}
proxy.close()
attackPage.close()
