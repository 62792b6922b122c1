// The app of test/e2e/kubelet/kubelet.e2e.ts's pods: baked into an image built FROM the project's image
// (it has node, nothing else), because the chart's app container takes only an image. It
// calls the API through the sidecar the way an app would, at the URL the pod gives it:
// COS_MANAGEMENT_URL (the parent-chart example sets it) or $COS_PROXY_URL/management (the
// injector sets COS_PROXY_URL). Node built-ins only. Every line it logs is one the test reads.
//
// APP_MODE=loop  (default) one GET every APP_INTERVAL_MS (2000), sequentially, logged as
//                "<time> request <n> GET <url> <status|error CODE>"; APP_PATH (/v1/clusters)
//                is the path under the API. On SIGTERM a request in flight is finished
//                first ("app: SIGTERM with request <n> in flight", then its line, then
//                "app: exit"), as an app that drains would.
// APP_MODE=once  one GET, then exit 0 on 200, 1 otherwise (a Job's work).
// APP_MODE=load  after APP_DELAY_S (0), APP_CONNECTIONS (256) keep-alive connections, each
//                sending GETs one after another for APP_DURATION_S (20); then
//                "load: done <json>" and idle.
import { Agent, request } from 'node:http'
import { clearInterval, setInterval } from 'node:timers'

const env = process.env
const base = env.COS_MANAGEMENT_URL ?? (env.COS_PROXY_URL === undefined ? undefined : `${env.COS_PROXY_URL}/management`)
const from = env.COS_MANAGEMENT_URL !== undefined ? 'COS_MANAGEMENT_URL' : 'COS_PROXY_URL'
if (base === undefined) {
  console.log('app: neither COS_MANAGEMENT_URL nor COS_PROXY_URL is set')
  process.exit(2)
}
const url = `${base}${env.APP_PATH ?? '/v1/clusters'}`
const mode = env.APP_MODE ?? 'loop'
console.log(`app: mode ${mode}, url ${url} (from ${from})`)

/** One GET; resolves to the status or "error CODE", never rejects. */
function get (agent) {
  return new Promise(resolve => {
    const req = request(url, { agent, timeout: 30_000 }, res => {
      res.resume()
      res.on('end', () => resolve(String(res.statusCode)))
      res.on('error', err => resolve(`error ${err.code ?? err.message}`))
    })
    req.on('timeout', () => req.destroy(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })))
    req.on('error', err => resolve(`error ${err.code ?? err.message}`))
    req.end()
  })
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

async function loop () {
  const interval = Number(env.APP_INTERVAL_MS ?? '2000')
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  let n = 0
  let inFlight
  let stopping = false
  process.on('SIGTERM', () => {
    stopping = true
    const exit = () => { console.log(`app: exit at ${new Date().toISOString()}`); process.exit(0) }
    if (inFlight === undefined) { console.log('app: SIGTERM, nothing in flight'); exit() }
    console.log(`app: SIGTERM with request ${n} in flight`)
    inFlight.then(exit)
  })
  while (!stopping) {
    n++
    inFlight = get(agent).then(status => { console.log(new Date().toISOString(), 'request', n, 'GET', url, status) })
    await inFlight
    inFlight = undefined
    if (!stopping) await sleep(interval)
  }
}

async function once () {
  const status = await get(new Agent({ keepAlive: false }))
  console.log(new Date().toISOString(), 'request', 1, 'GET', url, status)
  process.exit(status === '200' ? 0 : 1)
}

async function load () {
  process.on('SIGTERM', () => process.exit(0))
  await sleep(Number(env.APP_DELAY_S ?? '0') * 1000)
  console.log('load: starting')
  const connections = Number(env.APP_CONNECTIONS ?? '256')
  const end = Date.now() + Number(env.APP_DURATION_S ?? '20') * 1000
  const agent = new Agent({ keepAlive: true, maxSockets: connections })
  const statuses = {}
  let requests = 0
  const worker = async () => {
    while (Date.now() < end) {
      const status = await get(agent)
      requests++
      statuses[status] = (statuses[status] ?? 0) + 1
    }
  }
  const progress = setInterval(() => { console.log(`load: ${requests} requests so far`) }, 5000)
  await Promise.all(Array.from({ length: connections }, worker))
  clearInterval(progress)
  const ok = statuses['200'] ?? 0
  console.log(`load: done ${JSON.stringify({ connections, requests, ok, failed: requests - ok, statuses, sockets: Object.keys(agent.freeSockets).reduce((s, k) => s + agent.freeSockets[k].length, 0) })}`)
  agent.destroy()
  setInterval(() => {}, 1 << 30)
}

await ({ loop, once, load }[mode] ?? (() => { console.log(`app: unknown APP_MODE ${mode}`); process.exit(2) }))()
