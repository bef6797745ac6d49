// Starts the reference PDS (@atproto/pds) for interop tier 2 on 127.0.0.1
// only, configured from the environment (PDS_* variables, see
// docs/interop.md). PDS.start() listens on every interface; the app's
// listen is wrapped to bind loopback.
import { PDS, envToCfg, envToSecrets, readEnv } from '@atproto/pds'

const env = readEnv()
const pds = await PDS.create(envToCfg(env), envToSecrets(env))
const listen = pds.app.listen.bind(pds.app)
pds.app.listen = (port, ...rest) => listen(port, '127.0.0.1', ...rest)
await pds.start()
console.log(`pds listening on 127.0.0.1:${env.port}`)
const stop = async () => {
  await pds.destroy()
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
