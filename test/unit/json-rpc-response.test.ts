// Spotting the JSON-RPC response a request stream waits for
// (src/recording/json-rpc-response.ts): an answer that ends without it is repaired.
import t from 'tap'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { isResponseTo, isResultEvent, respondsTo } from '../../src/recording/json-rpc-response.js'
import { isJSONRPCResultResponse } from '@modelcontextprotocol/sdk/types.js'

t.test('the response to a request, and nothing else', async t => {
  t.ok(isResponseTo({ data: '{"jsonrpc":"2.0","id":7,"result":{}}' }, 7), 'a result')
  t.ok(isResponseTo({ data: '{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"x"}}' }, 'a'), 'an error')
  t.notOk(isResponseTo({ data: '{"jsonrpc":"2.0","id":7,"result":{}}' }, '7'), 'an id of another type')
  t.notOk(isResponseTo({ data: '{"jsonrpc":"2.0","id":8,"result":{}}' }, 7), 'another request\'s response')
  t.notOk(isResponseTo({ data: '{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage"}' }, 7), 'a request of the server\'s with the same id')
  t.notOk(isResponseTo({ data: '{"jsonrpc":"2.0","method":"notifications/progress","params":{"id":7,"result":1}}' }, 7), 'a notification that mentions the words')
  t.notOk(isResponseTo({ data: '{"id":7,"result":' }, 7), 'broken JSON')
  t.ok(isResponseTo({ frame: Buffer.from('id: u1\ndata: {"jsonrpc":"2.0","id":7,"result":{}}\n') }, 7), 'a raw frame')
})

t.test('a batch holding the response', async t => {
  t.ok(respondsTo(EventBatch.from([{ data: '{"method":"n"}' }, { data: '{"jsonrpc":"2.0","id":7,"result":{}}' }]), 7), 'among other events')
  t.notOk(respondsTo(EventBatch.from([{ data: '{"method":"n"}' }]), 7), 'a batch without it')
  t.notOk(respondsTo(EventBatch.from([{ data: '{"jsonrpc":"2.0","id":8,"result":{}}' }]), 7), 'a batch with another response')
})

t.test('a result as the SDK client reads one: what ends a resumed stream for it', async t => {
  const cases: Array<[string, string]> = [
    ['a result', '{"jsonrpc":"2.0","id":7,"result":{}}'],
    ['a string id', '{"jsonrpc":"2.0","id":"a","result":{"content":[]}}'],
    ['an error', '{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}'],
    ['a null result', '{"jsonrpc":"2.0","id":7,"result":null}'],
    ['a string result', '{"jsonrpc":"2.0","id":7,"result":"ok"}'],
    ['an array result', '{"jsonrpc":"2.0","id":7,"result":[]}'],
    ['a fractional id', '{"jsonrpc":"2.0","id":7.5,"result":{}}'],
    ['a null id', '{"jsonrpc":"2.0","id":null,"result":{}}'],
    ['no version', '{"id":7,"result":{}}'],
    ['another version', '{"jsonrpc":"1.0","id":7,"result":{}}'],
    ['an extra member', '{"jsonrpc":"2.0","id":7,"result":{},"extra":1}'],
    ['a batch', '[{"jsonrpc":"2.0","id":7,"result":{}}]'],
    ['a notification', '{"jsonrpc":"2.0","method":"notifications/progress","params":{}}'],
    ['broken JSON', '{"jsonrpc":"2.0","id":7,"result":']
  ]
  for (const [name, data] of cases) {
    let sdk = false
    try { sdk = isJSONRPCResultResponse(JSON.parse(data)) } catch {}
    t.equal(isResultEvent({ data }), sdk, `${name}: ${sdk ? 'a result' : 'no result'}, as the SDK says`)
  }
  t.ok(isResultEvent({ frame: Buffer.from('event: message\r\ndata: {"jsonrpc":"2.0",\r\ndata: "id":1,"result":{}}\r\n') }), 'a raw frame, CRLF, data on two lines, event type message')
  t.notOk(isResultEvent({ frame: Buffer.from('event: other\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n') }), 'an event of another type: no message for the client')
  t.notOk(isResultEvent({ event: 'gateway-gap', data: '{"reason":"recorder_lost","streamId":"x"}' }), 'a gap marker')
})
