// Starts the PLC directory (@did-plc/server, patched at install by
// plc-multikey.cjs) on 127.0.0.1:$PORT with its in-memory database. Its
// own bin listens on every interface; the app's listen is wrapped to bind
// loopback.
const { PlcServer, Database } = require("@did-plc/server");
const port = parseInt(process.env.PORT || "", 10);
if (!port) throw new Error("PORT is required");
(async () => {
  const plc = PlcServer.create({ db: Database.mock(), port });
  const listen = plc.app.listen.bind(plc.app);
  plc.app.listen = (p, ...rest) => listen(p, "127.0.0.1", ...rest);
  await plc.start();
  console.log(`plc listening on 127.0.0.1:${port}`);
  const stop = async () => { await plc.destroy(); process.exit(0); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
})();
