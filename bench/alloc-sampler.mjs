// Preloaded into a server by `npm run bench:profile -- --alloc`
// (node --import): V8's sampling heap profiler, over the inspector of the
// process itself, counting every sampled allocation including those the
// collector has freed since (what a request costs the young generation, not
// what stays). The first SIGUSR2 starts it, the second writes the bytes
// allocated by function to $BENCH_ALLOC_OUT as JSON. Nothing else is done.
import { Session } from 'node:inspector/promises'
import { renameSync, writeFileSync } from 'node:fs'
import process from 'node:process'

const out = process.env.BENCH_ALLOC_OUT
if (out !== undefined) {
  const session = new Session()
  session.connect()
  let sampling = false
  process.on('SIGUSR2', () => {
    void (async () => {
      if (!sampling) {
        sampling = true
        await session.post('HeapProfiler.startSampling', {
          samplingInterval: 4096, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true,
        })
        return
      }
      const { profile } = await session.post('HeapProfiler.stopSampling')
      const bytes = new Map()
      let total = 0
      const walk = node => {
        const f = node.callFrame
        const key = `${f.functionName || '(anonymous)'}\t${f.url}:${f.lineNumber + 1}`
        total += node.selfSize
        bytes.set(key, (bytes.get(key) ?? 0) + node.selfSize)
        for (const child of node.children) walk(child)
      }
      walk(profile.head)
      const sites = [...bytes].sort((a, b) => b[1] - a[1]).slice(0, 40).map(([key, size]) => {
        const [name, where] = key.split('\t')
        return { name, where, bytes: size }
      })
      writeFileSync(`${out}.part`, JSON.stringify({ total, sites }))
      renameSync(`${out}.part`, out) // whole, or not there
    })()
  })
}
