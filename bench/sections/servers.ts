// The servers of `npm run bench`: a fresh one per measurement (the proxy, the
// floor, the Go signer) or the upstream itself, and the Go signer built and
// checked before anything is measured.
import { rmSync } from 'node:fs'
import { join } from 'node:path'
import { buildGoSigner, checkGoSigner, startGoSigner, type GoSigner } from '../go-signer.js'
import { stopChild } from '../support/children.js'
import { pinProcess, vmMB } from '../support/machine.js'
import { countRequestLines } from '../support/measure.js'
import { imageEnvForThisNode, startFloor, startProxy, type Server } from '../support/servers.js'
import { progress, type Context, type Target } from './context.js'

export interface Started {
  readonly server: Server
  /** The process whose CPU and memory are measured. */
  readonly pid: number
  /** The upstream, when it is a separate process. */
  readonly upstreamPid: number | undefined
  readonly stop: () => Promise<Stopped>
}

export interface Stopped {
  /** VmHWM just before stopping. */
  readonly peakRssMB: number
  /** Request lines in its log (the proxy only). */
  readonly logLines?: number
}

let logSeq = 0

/**
 * A fresh server for one measurement, pinned to the measured core. `direct`
 * is the upstream itself, moved to that core for the measurement; its VmHWM
 * is over its whole life, not this scenario's.
 */
export async function start (ctx: Context, target: Target): Promise<Started> {
  const { pin, upstream } = ctx
  if (target === 'direct') {
    pinProcess(upstream.child.pid, pin.sut)
    return {
      server: { child: upstream.child, url: upstream.url, readyMs: Number.NaN },
      pid: upstream.child.pid,
      upstreamPid: undefined,
      stop: async () => {
        const peakRssMB = vmMB(upstream.child.pid, 'VmHWM')
        pinProcess(upstream.child.pid, pin.upstream)
        return { peakRssMB }
      },
    }
  }
  const go = ctx.goSigner
  const server = target === 'floor'
    ? await startFloor(upstream.url, pin.sut)
    : target === 'floor-image'
      // The floor as it would run in the proxy's container: the image's Node
      // flags and environment (its heap limits). In a pod the heap limit is
      // small whatever the flags (Node sizes it from the memory limit), and a
      // small heap limit alone costs Node 24 10-15 % of its CPU per request
      // here (docs/performance.md): this floor pays it as the proxy does.
      ? await startFloor(upstream.url, pin.sut, ctx.proxy.build.nodeArgs, imageEnvForThisNode(ctx.proxy.build.env))
    : target === 'go'
      ? await startGoSigner({ binary: 'binary' in go ? go.binary : 'go-signer', upstreamUrl: upstream.url, core: pin.sut })
      : await startProxy({
      upstreamUrl: upstream.url,
      // The image's defaults (info, COS_ACCESS_LOG=errors: no line for a success), or a line for every request.
      logLevel: 'info',
      logFile: join(ctx.scratch, `proxy-${++logSeq}.log`),
      cwd: ctx.scratch,
      core: pin.sut,
      nodeArgs: ctx.proxy.nodeArgs,
      env: target === 'proxy-all' ? { ...ctx.proxy.extraEnv, COS_ACCESS_LOG: 'all' } : ctx.proxy.extraEnv,
      build: ctx.proxy.build,
    })
  const { pid } = server.child
  return {
    server,
    pid,
    upstreamPid: upstream.child.pid,
    stop: async () => {
      const peakRssMB = vmMB(pid, 'VmHWM')
      await stopChild(server.child)
      await server.logReader?.exited
      if (server.logFile === undefined) return { peakRssMB }
      const logLines = countRequestLines(server.logFile)
      rmSync(server.logFile, { force: true })
      return { peakRssMB, logLines }
    },
  }
}

/** Builds the Go signer and proves its tokens are accepted (the run fails if not), or says why it is skipped. */
export async function goYardstick (scratch: string): Promise<GoSigner & { readonly checked?: string }> {
  const built = buildGoSigner(scratch)
  if (!('binary' in built)) {
    progress(`  Go signer skipped: ${built.skipped}`)
    return built
  }
  const checked = await checkGoSigner(built.binary)
  progress(`  ${built.go}: ${checked}`)
  return { ...built, checked }
}
