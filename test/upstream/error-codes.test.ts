import t from 'tap'
import { errorCodes, hasErrorCode } from '../../src/upstream/error-codes.js'
import { upstreamErrorStatus } from '../../src/proxy/forward-response.js'

const coded = (code: string | undefined, cause?: unknown): Error => Object.assign(new Error(code ?? 'no code', cause === undefined ? {} : { cause }), code === undefined ? {} : { code })

t.test('codes are read along the cause chain, outside in, at most five deep', async t => {
  t.same([...errorCodes(coded('A', coded(undefined, coded('C'))))], ['A', 'C'], 'an error without a code is passed through')
  t.same([...errorCodes(new AggregateError([coded('ECONNREFUSED'), coded('EHOSTUNREACH')]))], ['ECONNREFUSED'], 'an AggregateError: its first error')
  let deep: Error = coded('L6')
  for (let i = 5; i >= 1; i--) deep = coded(`L${i}`, deep)
  t.same([...errorCodes(deep)], ['L1', 'L2', 'L3', 'L4', 'L5'])
  t.same([...errorCodes('not an error')], [])
  t.ok(hasErrorCode(coded('X', coded('COS_BODY_TOO_LARGE')), 'COS_BODY_TOO_LARGE'))
  t.notOk(hasErrorCode(coded('X'), 'Y'))
})

t.test('the status the client gets: 504 for a connect or headers timeout anywhere on the chain, 502 for the rest', async t => {
  t.equal(upstreamErrorStatus(coded('UND_ERR_HEADERS_TIMEOUT')), 504)
  t.equal(upstreamErrorStatus(coded('WRAPPER', coded('UND_ERR_CONNECT_TIMEOUT'))), 504)
  t.equal(upstreamErrorStatus(coded('WRAPPER', coded(undefined, coded('UND_ERR_CONNECT_TIMEOUT')))), 504, 'two levels down')
  t.equal(upstreamErrorStatus(coded('WRAPPER', coded('ECONNREFUSED'))), 502)
  t.equal(upstreamErrorStatus(coded('UND_ERR_BODY_TIMEOUT')), 502, 'a body that stalls after the headers is not a 504 in the contract')
  t.equal(upstreamErrorStatus(new Error('no code at all')), 502)
})
