// Spotting the JSON-RPC response a request stream waits for
// (src/recording/json-rpc-response.ts): an answer that ends without it is repaired.
import t from 'tap'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { isResponseTo, respondsTo } from '../../src/recording/json-rpc-response.js'

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
