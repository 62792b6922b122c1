import t from 'tap'
import { createLogger, inLogFormat } from '../../src/observability/logger.js'
import { PrettyLines, prettyLine } from '../../src/observability/pretty-log.js'
import { LogCapture } from '../support/helpers.js'

t.test('a pretty line: time, level, message, then the other fields as key=value, and nothing else', async t => {
  const json = '{"level":"info","time":"2026-11-23T22:51:07.123Z","name":"cos-auth-proxy","reqId":"abc-1","msg":"request","method":"GET","route":"management","status":200,"ms":1.5,"aborted":false}\n'
  t.equal(prettyLine(json), '22:51:07.123 INFO  request reqId=abc-1 method=GET route=management status=200 ms=1.5 aborted=false\n')
})

t.test('values that are not one plain word are quoted, objects shown as JSON, errors as type and message without the stack', async t => {
  const line = prettyLine(JSON.stringify({ level: 'error', time: '2026-11-23T22:51:07.123Z', msg: 'upstream failed', problem: 'two words', routes: [{ name: 'api' }], err: { type: 'TypeError', message: 'bad "thing"', stack: 'TypeError: bad\n    at x (y.js:1:1)' } }))
  t.equal(line, '22:51:07.123 ERROR upstream failed problem="two words" routes=[{"name":"api"}] err="TypeError: bad \\"thing\\""\n')
  t.equal(line.split('\n').length, 2, 'one line, whatever the stack holds')
})

t.test('a message or value carrying terminal escape sequences cannot drive the terminal: control characters are shown escaped', async t => {
  const line = prettyLine(JSON.stringify({ level: 'warn', time: '2026-11-23T22:51:07.123Z', msg: 'upstream said \x1b[2J\rgone\n', detail: 'x\x1b]0;title\x07', csi: 'a\u009b31m', err: { type: 'Error', message: '\x1b[31mred', stack: 's' } }))
  t.equal(line, '22:51:07.123 WARN  upstream said \\u001b[2J\\u000dgone\\u000a detail="x\\u001b]0;title\\u0007" csi="a\\u009b31m" err="Error: \\u001b[31mred"\n')
  // eslint-disable-next-line no-control-regex -- matching control characters is the point
  t.notMatch(line.slice(0, -1), /[\u0000-\u001f\u007f-\u009f]/, 'no control character left but the line end')
})

t.test('a line that is not JSON passes through as it came, on its own line', async t => {
  t.equal(prettyLine('not json'), 'not json\n')
})

t.test('the level is coloured only when asked (a terminal without NO_COLOR)', async t => {
  const json = '{"level":"warn","time":"2026-11-23T22:51:07.123Z","msg":"careful"}'
  t.equal(prettyLine(json), '22:51:07.123 WARN  careful\n')
  t.equal(prettyLine(json, true), '22:51:07.123 \x1b[33mWARN \x1b[0m careful\n')
})

t.test('COS_LOG_FORMAT picks the destination: json writes pino\'s lines as they are, pretty one readable line per event', async t => {
  const json = new LogCapture()
  t.equal(await inLogFormat('json', json), json, 'json: the destination itself, no formatter in between')
  const capture = new LogCapture()
  const pretty = await inLogFormat('pretty', capture)
  t.ok(pretty instanceof PrettyLines)
  const logger = createLogger('info', pretty)
  logger.info({ port: 8080 }, 'cos-auth-proxy listening')
  logger.warn('second')
  t.equal(capture.lines.length, 2)
  t.match(capture.lines[0], /^\d\d:\d\d:\d\d\.\d{3} INFO {2}cos-auth-proxy listening port=8080$/)
  t.match(capture.lines[1], /^\d\d:\d\d:\d\d\.\d{3} WARN {2}second$/)
})
